"""The two deployments the fidelity check compares, started for it and always taken down.

The real engine: sglang itself (:mod:`forensics.engine.launch`), a prefill, a decode and
sglang-router's mini load balancer, with the ``slow-prefill`` model so a 3000-token prompt keeps
its KV pending for seconds (the abort's window), and the decode's
``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` short so the waiting timeout comes within the check.
The twin: :func:`forensics.twin.api.up` with the same waiting timeout and a prefill slow enough
(``prefill_rate_tps``) for the same window. Either side can instead be given as an inventory
(``twin up`` writes one for both engines), which the check only reads.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from forensics.fidelity.capture import RoleTarget, Target

WAITING_TIMEOUT_S = 60.0  # above a fresh real engine's first request on a loaded 2-core machine (24 s seen), short enough for CI
# The twin's first request is served at once: a shorter timeout makes the same lines sooner (the
# check masks numbers, so "timed out after 20.0s" and "after 60.0s" are one format).
TWIN_WAITING_TIMEOUT_S = 20.0
TWIN_PREFILL_RATE_TPS = 300.0  # the twin's 3000-token prefill takes ~10 s, as the real one's takes seconds
REAL_MODEL = "slow-prefill"
# A server is ready in ~25 s alone; on 2 cores shared with other real engines it took 216 s and more.
REAL_READY_TIMEOUT_S = 900.0


@contextlib.contextmanager
def real_engine(version: str, *, waiting_timeout_s: float = WAITING_TIMEOUT_S, directory: str | Path | None = None,
                progress=None) -> Iterator[Target]:
    """Real sglang ``version`` as a PD pair behind the mini LB; yields its :class:`Target`."""
    from forensics.engine import environment, launch, model

    env = environment.prepare(version, progress=progress)
    built = model.build(REAL_MODEL, env.python)
    with contextlib.ExitStack() as stack:
        where = Path(directory) if directory else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix=f"fidelity-real-{version}-")))
        prefill_port, bootstrap_port, decode_port, router_port = launch.free_server_ports(4)
        started: list[launch.EngineProcess] = []
        try:
            prefill = launch.start_server(env, built.path, "prefill", prefill_port, where / "prefill.log",
                                          bootstrap_port=bootstrap_port)
            started.append(prefill)
            decode = launch.start_server(env, built.path, "decode", decode_port, where / "decode.log",
                                         env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": f"{waiting_timeout_s:g}"})
            started.append(decode)
            prefill.wait_ready(REAL_READY_TIMEOUT_S)
            decode.wait_ready(REAL_READY_TIMEOUT_S)
            router = launch.start_router(env, prefill.url, bootstrap_port, decode.url, router_port,
                                         where / "router.log")
            started.append(router)
            router.wait_ready(REAL_READY_TIMEOUT_S)
            yield Target("real", version, router.url, {
                "prefill": RoleTarget("prefill", prefill.url, prefill.log_file, prefill.pid),
                "decode": RoleTarget("decode", decode.url, decode.log_file, decode.pid)}, waiting_timeout_s)
        finally:
            for process in reversed(started):
                process.stop()


@contextlib.contextmanager
def twin(version: str, *, waiting_timeout_s: float = TWIN_WAITING_TIMEOUT_S) -> Iterator[Target]:
    """The twin of ``version``, as slow to prefill as the check's abort needs; yields its :class:`Target`."""
    from forensics.twin import api

    # disaggregation_debug off: sglang's default level, as the real engine runs (the default twin logs
    # sglang.srt.disaggregation at DEBUG for the storm; docs/fidelity.md)
    with api.up(version, waiting_timeout=waiting_timeout_s, prefill_rate_tps=TWIN_PREFILL_RATE_TPS,
                disaggregation_debug=False) as deployment:
        target = Target.from_inventory(deployment.inventory_path, name="twin")
        target.waiting_timeout_s = waiting_timeout_s
        yield target
