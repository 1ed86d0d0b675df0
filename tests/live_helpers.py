"""Helpers for the live-evidence acceptance tests: a twin seen as a live deployment over SSH.

``ssh_inventory`` writes an inventory that reaches the twin's engines the way an operator
reaches production: every command through the test sshd on 127.0.0.1, logs read from the
twin's files (over SFTP) or from journal files, processes found by title and pid file.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import tomli_w
from twin_helpers import kill_client_during_transfer_wait, twin_state, wait_until

PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def ssh_inventory(twin, sshd, path: Path, *, logs: str | dict | None = "file", py_spy: str = PY_SPY,
                  journalctl: str = "journalctl", sudo: bool = False, user: str | None = None,
                  name: str = "twin-over-ssh", pid_dir: Path | None = None) -> Path:
    """An inventory for ``twin`` whose host is the test ``sshd`` (ssh://USER@127.0.0.1:PORT).

    ``logs``: "file" (the twin's log files, read over SFTP), None (no log source: stderr
    unavailable), or a mapping role -> logs table (journal files). ``pid_dir``: copy the
    pid files there (as /run is, readable by every user) and point the selectors at the copies.
    """
    source = twin.inventory
    engines = []
    for engine in source.engines:
        pid_file = engine.pid_file
        if pid_dir is not None:
            pid_file = str(pid_dir / Path(engine.pid_file).name)
            Path(pid_file).write_text(Path(engine.pid_file).read_text())
            Path(pid_file).chmod(0o644)
        process = {"title": engine.process, "pid_file": pid_file}
        entry = {"name": f"{engine.role}-0", "role": engine.role, "host": "twin-node", "url": engine.url,
                 "process": process}
        if engine.bootstrap_port is not None:
            entry["bootstrap_port"] = engine.bootstrap_port
        if logs == "file":
            entry["logs"] = {"file": engine.log_file}
        elif isinstance(logs, dict) and engine.role in logs:
            entry["logs"] = logs[engine.role]
        engines.append(entry)
    document = {
        "deployment": {"name": name, "sglang": source.sglang, "backend": source.backend or "nixl"},
        "hosts": {"twin-node": {"address": "127.0.0.1", "port": sshd.port, "user": user or sshd.user,
                                "key": str(sshd.client_key), "known_hosts": str(sshd.known_hosts),
                                "ssh_config": "/dev/null", "py_spy": py_spy, "journalctl": journalctl,
                                "sudo": sudo}},
        "engine": engines,
    }
    path.write_text(tomli_w.dumps(document))
    return path


def bootstrap_alive(twin) -> bool:
    return bool(twin_state(twin.prefill)["bootstrap_thread_alive"])


def health_answers_quickly(twin, within_s: float = 1.0) -> bool:
    """The prefill's /health answers within ``within_s`` (no long batch ahead of it)."""
    import httpx

    try:
        return httpx.get(twin.prefill + "/health", timeout=30).elapsed.total_seconds() < within_s
    except httpx.HTTPError:
        return False


def ensure_wedged(twin) -> None:
    """Kill a client mid-transfer until the prefill's bootstrap thread is dead (as the incident did).

    Then wait until the prefill has finished the killed client's long prefill batch: until
    then its /health waits behind that batch (as sglang's does), which is not what a
    responder arriving later sees.
    """
    for _ in range(3):  # on a loaded machine a kill can land outside the transfer wait: try again
        if not bootstrap_alive(twin):
            break
        try:
            kill_client_during_transfer_wait(twin)
            wait_until(lambda: not bootstrap_alive(twin), 30, "the prefill's bootstrap thread to die")
        except AssertionError:
            continue
    assert not bootstrap_alive(twin), "three killed clients did not wedge the twin"
    wait_until(lambda: health_answers_quickly(twin), 60, "the prefill's /health to answer promptly")


def ensure_healthy(twin) -> None:
    """Restart the prefill when its bootstrap thread is dead (the traceback stays in its log).

    Then one real request must complete: until the decode has noticed the restart (its
    heartbeat, as in sglang), it may still send to the old prefill's socket.
    """
    import httpx

    if not bootstrap_alive(twin):
        # sglang 0.5.15's decode blocks for good when a request it holds sends its ABORT to the
        # restarted prefill too soon (patched_engine.decode_hazard): let the wedge's waiting
        # requests time out first (the twins here wait 15 s).
        wait_until(lambda: not (twin_state(twin.decode)["prealloc_queue"] or twin_state(twin.decode)["transfer_queue"]),
                   120, "the wedge's waiting requests to time out at the decode")
        twin.restart("prefill")
        wait_until(lambda: bootstrap_alive(twin), 60, "the restarted prefill's bootstrap thread")

    def completes() -> bool:
        response = httpx.post(twin.router + "/generate", timeout=120,
                              json={"text": "after the restart", "sampling_params": {"max_new_tokens": 1}})
        return response.status_code == 200

    wait_until(completes, 180, "a request to complete through the router")


@contextmanager
def steady_load(twin, clients: int = 2):
    """Clients sending small completions through the router back to back; never closed early."""
    import httpx

    stop = threading.Event()
    answered = [0]
    errors: list[str] = []

    def client(index: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(600.0)) as http:
            while not stop.is_set():
                try:
                    r = http.post(twin.router + "/generate", json={
                        "text": f"load client {index} " * 20, "sampling_params": {"max_new_tokens": 4}})
                    answered[0] += r.status_code == 200
                except httpx.HTTPError as exc:  # recorded: the test decides whether it matters
                    errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: answered[0] >= clients, 60, "the load's first answers")
        yield answered
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert not errors, errors[:3]
