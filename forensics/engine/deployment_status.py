"""``twin status`` of a real-engine deployment, in the twin's :class:`~forensics.twin.api.TwinStatus` shape.

Per role: the leader's pid, alive (a process of the role that is provably this deployment's),
answering (``/health`` 200), and for the servers the queue gauges read from sglang's own
``/metrics``. The prefill's ``bootstrap_thread_alive`` comes from a py-spy dump of its scheduler
(real sglang reports no such thing itself): True when a thread named ``...(bootstrap_thread)`` is
there, False when the dump has threads and none of them is it, None (with ``thread_dump``
saying why) when the scheduler could not be dumped.
"""

from __future__ import annotations

import re
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from forensics.engine import records, roles

HEALTH_TIMEOUT_S = 10.0  # a real /health runs a generation; the machine may be loaded
# The queue lengths, by the names the twin's status uses, from the gauges sglang exports.
QUEUE_METRICS = {
    "prefill": {"bootstrap_queue": "sglang:num_prefill_bootstrap_queue_reqs", "waiting_queue": "sglang:num_queue_reqs",
                "inflight_queue": "sglang:num_prefill_inflight_queue_reqs"},
    "decode": {"prealloc_queue": "sglang:num_decode_prealloc_queue_reqs",
               "transfer_queue": "sglang:num_decode_transfer_queue_reqs", "running": "sglang:num_running_reqs"},
}
BOOTSTRAP_THREAD = "bootstrap_thread"


def status(deployment):
    from forensics.twin.api import TwinStatus

    settings = deployment.settings
    result = TwinStatus(inventory=str(deployment.inventory_path), sglang=settings.sglang, patched=settings.patched,
                        engine="sglang", model=settings.model_size, roles={})
    directory = Path(settings.directory)
    for role in roles.ROLE_ORDER:
        url = roles.url_of(settings, role)
        entry = {"pid": deployment.pid(role), "alive": records.running(directory, role), "url": url,
                 "answering": _health(url)}
        if role != "router":
            entry["scheduler_pid"] = deployment.scheduler_pid(role)
            queues = _queues(url, role)
            if queues:
                entry["queues"] = queues
        if role == "prefill":
            alive, why = bootstrap_thread_alive(deployment, settings)
            entry["bootstrap_thread_alive"] = alive
            if why:
                entry["thread_dump"] = why
        result["roles"][role] = entry
    return result


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=HEALTH_TIMEOUT_S) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _queues(url: str, role: str) -> dict[str, int]:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=HEALTH_TIMEOUT_S) as answer:
            text = answer.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    found = {}
    for word, metric in QUEUE_METRICS[role].items():
        values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(metric)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
        if values:
            found[word] = int(sum(values))
    return found


def py_spy_program(settings) -> str | None:
    """py-spy on PATH, beside this interpreter, or in the engine's own environment (it pins one)."""
    for candidate in (shutil.which("py-spy"), Path(sys.executable).with_name("py-spy"),
                      Path(settings.engine_env) / "venv" / "bin" / "py-spy"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def bootstrap_thread_alive(deployment, settings) -> tuple[bool | None, str | None]:
    from forensics.hosts import LocalHost
    from forensics.threads import dump_threads

    pid = deployment.scheduler_pid("prefill")
    if pid is None:
        return None, "the prefill's scheduler process is not running (or not recorded)"
    program = py_spy_program(settings)
    if program is None:
        return None, "py-spy is not installed here"
    dump = dump_threads(LocalHost(), [pid], py_spy=program, timeout=30, label="prefill")
    if pid in dump.gaps:
        return None, dump.gaps[pid].reason
    names = [str(name) for name in dump.frame["thread_name"]]
    return any(BOOTSTRAP_THREAD in name for name in names), None
