"""The real Mooncake transfer engine for the sandbox and the twin: the release's own wrapper, TCP on loopback.

sglang's Mooncake KV manager talks to the engine through its own wrapper class,
``MooncakeTransferEngine`` (``sglang/srt/distributed/device_communicators/
mooncake_transfer_engine.py``): ``batch_register`` for the KV and aux buffers,
``batch_transfer_sync`` for the pages, ``get_session_id`` for the frames. The sandbox stubs
``sglang.srt.distributed`` as a whole (torch.distributed), so this module loads that one
file from the twin's copy of the release and builds the wrapper with the release's own
``__init__``: the engine is PyPI's ``mooncake-transfer-engine-non-cuda`` (``mooncake.engine
.TransferEngine``), which imports on a CPU once Debian's ``libibverbs1`` and ``librdmacm1``
are installed, and moves host memory between two processes over TCP.

How TCP is chosen, per release (the wrapper always initializes with metadata ``P2PHANDSHAKE``):

* 0.5.13 and later: the wrapper passes ``envs.MOONCAKE_PROTOCOL`` (default ``"rdma"``); the
  sandbox and the twin set ``MOONCAKE_PROTOCOL=tcp`` in their processes, as an operator without
  RDMA would. (These releases also read ``MC_FORCE_TCP=1``, only to clear the IB device name.)
* before 0.5.13: the wrapper passes ``"rdma"`` hard-coded. The engine itself reads
  ``MC_FORCE_TCP=1`` ("MC_FORCE_TCP is set, using TCP transport only"), which the sandbox and
  the twin set, so a host with an RDMA NIC stays on loopback TCP too. Without it, this engine
  build on a host with no RDMA device logs ``No RDMA devices found`` and installs its TCP
  transport anyway (measured here: same bytes, same API).

:func:`transport_choice` states which of the two applies to a release.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

from packaging.version import Version

from forensics.exitcodes import EnvironmentProblem

ENGINE_PACKAGE = "mooncake-transfer-engine-non-cuda"
ENGINE_PIN = "0.3.13.post1"  # the build measured here (also pinned in ./run)
WRAPPER = "sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py"
OLD_WRAPPER = "sglang/srt/disaggregation/mooncake/transfer_engine.py"
WRAPPER_MODULE = "sglang.srt.distributed.device_communicators.mooncake_transfer_engine"
PROTOCOL_ENV_FROM = Version("0.5.13")


class MooncakeUnavailable(EnvironmentProblem):
    """The Mooncake transfer engine cannot be imported or initialized here."""


def engine_import_problem() -> str | None:
    """None when ``mooncake.engine.TransferEngine`` imports; else why not (one line)."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as exc:  # the .so needs libibverbs.so.1 and librdmacm.so.1 even for TCP
        return (f"the Mooncake transfer engine does not import ({exc}); install {ENGINE_PACKAGE}=={ENGINE_PIN} "
                "and Debian's libibverbs1 and librdmacm1 (./run does both)")
    return None


def transport_choice(version: str) -> str:
    """How a twin of ``version`` ends up on TCP (see the module docstring)."""
    if Version(version) >= PROTOCOL_ENV_FROM:
        return "MOONCAKE_PROTOCOL=tcp (read by the release's MooncakeTransferEngine.initialize)"
    return ("protocol 'rdma' hard-coded by the release; MC_FORCE_TCP=1 (read by the engine) makes it TCP "
            "(with no RDMA device the engine falls back to TCP by itself)")


def select_tcp(version: str) -> None:
    """Set what makes the release's wrapper (or, before 0.5.13, the engine) choose TCP, before the
    engine initializes."""
    if Version(version) >= PROTOCOL_ENV_FROM:
        os.environ["MOONCAKE_PROTOCOL"] = "tcp"
    else:
        os.environ["MC_FORCE_TCP"] = "1"


def wrapper_class(sglang_root: str | Path):
    """The release's own ``MooncakeTransferEngine`` class, from the twin's copy of its files.

    Loaded by file under its real module name (so its log lines carry sglang's logger name)
    but not entered in ``sys.modules``: the sandbox's stub of ``sglang.srt.distributed`` stays
    what every other importer sees. Its imports (``sglang.srt.environ``,
    ``sglang.srt.utils.network``) resolve through the sandbox's import shim, which loads
    both for real.
    """
    path = Path(sglang_root) / WRAPPER
    if not path.is_file():
        raise MooncakeUnavailable(f"{path}: the release has no MooncakeTransferEngine wrapper")
    spec = importlib.util.spec_from_file_location(WRAPPER_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if "run_with_deadline" in vars(module):
        # 0.5.20+ bound the engine's initialize with sglang.srt.utils.common.run_with_deadline; that
        # module pulls in torch and is stubbed, so the twin supplies the same contract.
        module.run_with_deadline = run_with_deadline
    return module.MooncakeTransferEngine


def run_with_deadline(fn, *, timeout_s: float, what: str):
    """``fn()`` in a daemon thread; RuntimeError naming ``what`` if it has not returned in ``timeout_s``."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="mooncake-engine-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RuntimeError(f"{what} did not return within {timeout_s}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def wrapper_problem(sglang_root: str | Path) -> str | None:
    """None when the release's wrapper can run here; else why not. Before 0.5.10 its session id
    comes from ``sglang.srt.utils`` helpers (``maybe_wrap_ipv6_address``), which the sandbox stubs;
    before 0.5.9 there is no wrapper (the engine lives in disaggregation/mooncake/transfer_engine.py)."""
    path = Path(sglang_root) / WRAPPER
    if not path.is_file():
        if (Path(sglang_root) / OLD_WRAPPER).is_file():
            return (f"the release's MooncakeTransferEngine is the older {OLD_WRAPPER} (before 0.5.9), "
                    "which the sandbox and the twin do not load")
        return f"the release has no MooncakeTransferEngine wrapper ({WRAPPER})"
    if "NetworkAddress" not in path.read_text(encoding="utf-8", errors="replace"):
        return ("the release's MooncakeTransferEngine builds its session id with sglang.srt.utils helpers "
                "that the sandbox stubs")
    return None


def engine_or_reason(sglang_root: str | Path, version: str, hostname: str = "127.0.0.1"):
    """``(engine, None)`` with the release's real engine where its code and this machine allow,
    else ``(None, why)``: the sandbox then keeps its session stand-in and says why."""
    problem = wrapper_problem(sglang_root) or engine_import_problem()
    if problem:
        return None, problem
    try:
        return make_engine(sglang_root, version, hostname), None
    except MooncakeUnavailable as exc:
        return None, str(exc)


def make_engine(sglang_root: str | Path, version: str, hostname: str = "127.0.0.1"):
    """The release's ``MooncakeTransferEngine(hostname, gpu_id=0, ib_device=None)``, on TCP."""
    problem = engine_import_problem()
    if problem:
        raise MooncakeUnavailable(problem)
    select_tcp(version)
    cls = wrapper_class(sglang_root)
    try:
        return cls(hostname=hostname, gpu_id=0, ib_device=None)
    except Exception as exc:
        raise MooncakeUnavailable(f"sglang {version}'s MooncakeTransferEngine did not initialize: {exc}") from exc
