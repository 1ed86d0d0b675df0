"""The real Mooncake transfer engine for the sandbox and the twin: the release's own wrapper, TCP on loopback.

sglang's Mooncake KV manager talks to the engine through its own wrapper class,
``MooncakeTransferEngine``: ``batch_register`` for the KV and aux buffers, ``batch_transfer_sync``
for the pages, ``get_session_id`` for the frames. Where it lives, per release:

* 0.5.9 and later: ``sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py``
  (:data:`WRAPPER`). The sandbox stubs ``sglang.srt.distributed`` as a whole (torch.distributed),
  so this module loads that one file by path.
* 0.5.1 to 0.5.8.post1: ``sglang/srt/disaggregation/mooncake/transfer_engine.py``
  (:data:`OLD_WRAPPER`), loaded the same way.

Either way the wrapper is built with the release's own ``__init__``: the engine is PyPI's
``mooncake-transfer-engine-non-cuda`` (``mooncake.engine.TransferEngine``), which imports on a CPU
once Debian's ``libibverbs1`` and ``librdmacm1`` are installed, and moves host memory between two
processes over TCP. Up to 0.5.9 the wrapper builds its session id with
``sglang.srt.utils.maybe_wrap_ipv6_address`` (from 0.5.10 with ``sglang.srt.utils.network``, which
the shim loads for real); the sandbox stubs ``sglang.srt.utils``, so that helper (and the
wrapper's other standard-library helpers, ``get_bool_env_var``, ``get_free_port``) is the
release's own definition, compiled from its utils file (:mod:`.release_utils`).

How TCP is chosen, per release (the wrapper always initializes with metadata ``P2PHANDSHAKE``):

* 0.5.13 and later: the wrapper passes ``envs.MOONCAKE_PROTOCOL`` (default ``"rdma"``); the
  sandbox and the twin set ``MOONCAKE_PROTOCOL=tcp`` in their processes, as an operator without
  RDMA would. (These releases also read ``MC_FORCE_TCP=1``, only to clear the IB device name.)
* 0.5.1 to 0.5.12.post1 (both wrapper files): the wrapper passes ``"rdma"`` hard-coded (the
  ``"ascend"`` branch needs ``ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE``, unset here). The engine
  itself reads ``MC_FORCE_TCP=1`` ("MC_FORCE_TCP is set, using TCP transport only"), which the
  sandbox and the twin set, so a host with an RDMA NIC stays on loopback TCP too. Without it,
  this engine build on a host with no RDMA device logs ``No RDMA devices found`` and installs
  its TCP transport anyway (measured here: same bytes, same API).

:func:`transport_choice` states which of the two applies to a release.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import threading
from pathlib import Path

from packaging.version import Version

from forensics.exitcodes import EnvironmentProblem
from forensics.sandbox.errors import SandboxError
from forensics.sandbox.loopback import confine_mooncake
from forensics.sandbox.plt_hook import PltHookError

ENGINE_PACKAGE = "mooncake-transfer-engine-non-cuda"
ENGINE_PIN = "0.3.13.post1"  # the build measured here (also pinned in ./run)
WRAPPER = "sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py"
OLD_WRAPPER = "sglang/srt/disaggregation/mooncake/transfer_engine.py"
WRAPPER_MODULE = "sglang.srt.distributed.device_communicators.mooncake_transfer_engine"
OLD_WRAPPER_MODULE = "sglang.srt.disaggregation.mooncake.transfer_engine"
PROTOCOL_ENV_FROM = Version("0.5.13")
# Helpers of the stubbed sglang.srt.utils that this module supplies itself (same contract; the
# release's own pulls in torch): see wrapper_class.
SUPPLIED_HERE = ("run_with_deadline",)


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
    """How a twin of ``version`` ends up on TCP (see the module docstring): one answer for
    0.5.13 and later, one for 0.5.1 to 0.5.12.post1 (old and new wrapper file alike)."""
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


def wrapper_path(sglang_root: str | Path) -> Path | None:
    """The release's ``MooncakeTransferEngine`` file: :data:`WRAPPER` (0.5.9+), else
    :data:`OLD_WRAPPER` (0.5.1 to 0.5.8.post1); None when it has neither."""
    for relative in (WRAPPER, OLD_WRAPPER):
        path = Path(sglang_root) / relative
        if path.is_file():
            return path
    return None


def wrapper_class(sglang_root: str | Path):
    """The release's own ``MooncakeTransferEngine`` class, from the twin's copy of its files.

    Loaded by file under its real module name (so its log lines carry sglang's logger name)
    but not entered in ``sys.modules``: the sandbox's stub of ``sglang.srt.distributed`` stays
    what every other importer sees (and, before 0.5.9, ``mooncake/conn.py``'s own import of the
    old file is left alone). Its imports (``sglang.srt.environ``, ``sglang.srt.utils.network``)
    resolve through the sandbox's import shim, which loads both for real; the helpers it takes
    from the stubbed ``sglang.srt.utils`` (up to 0.5.9) are replaced by the release's own.
    """
    from forensics.sandbox.release_utils import serve_release_helpers
    from forensics.sglang_source import verify_file

    path = wrapper_path(sglang_root)
    if path is None:
        raise MooncakeUnavailable(f"{Path(sglang_root) / WRAPPER}: the release has no MooncakeTransferEngine wrapper")
    verify_file(path)  # a cached release's file: checked against its recorded sha256
    name = WRAPPER_MODULE if path.as_posix().endswith(WRAPPER) else OLD_WRAPPER_MODULE
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        serve_release_helpers(vars(module), sglang_root)
    except SandboxError as exc:  # a helper that is not plain standard-library code: named, not stubbed
        raise MooncakeUnavailable(f"{path}: {exc}") from exc
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
    """None when the release has a ``MooncakeTransferEngine`` wrapper the sandbox can load (every
    0.5.x release: :data:`OLD_WRAPPER` up to 0.5.8.post1, :data:`WRAPPER` from 0.5.9); else why not."""
    from forensics.sandbox.release_utils import RELEASE_HELPERS, STUBBED_MODULE, release_helpers
    from forensics.sglang_source import verified_read_text

    path = wrapper_path(sglang_root)
    if path is None:
        return f"the release has no MooncakeTransferEngine wrapper (neither {WRAPPER} nor {OLD_WRAPPER})"
    # What it takes from the stubbed sglang.srt.utils (up to 0.5.9) must be a helper the sandbox
    # serves from the release's own source; anything else would stay a stub (a session id reading
    # "<sandbox stub ...>"), so it is named here, before any engine starts.
    tree = ast.parse(verified_read_text(path), filename=str(path))
    taken = sorted({alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module in (STUBBED_MODULE, f"{STUBBED_MODULE}.common") for alias in node.names})
    unserved = [name for name in taken if name not in RELEASE_HELPERS and name not in SUPPLIED_HERE]
    if unserved:
        return (f"the release's MooncakeTransferEngine ({path.name}) uses {', '.join(unserved)} from "
                f"{STUBBED_MODULE}, which the sandbox stubs")
    try:
        release_helpers(sglang_root, [name for name in taken if name in RELEASE_HELPERS])
    except SandboxError as exc:
        return f"the release's MooncakeTransferEngine needs a {STUBBED_MODULE} helper the sandbox cannot serve: {exc}"
    return None


def engine_or_reason(sglang_root: str | Path, version: str, hostname: str = "127.0.0.1"):
    """``(engine, None)`` with the release's real engine where its code and this machine allow
    (every 0.5.x release has a wrapper the sandbox loads, so in practice: wherever the engine
    imports), else ``(None, why)``: the sandbox then keeps its session stand-in and says why."""
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
    try:
        confine_mooncake(hostname)  # its listeners bind INADDR_ANY / :: unless redirected (sandbox.loopback)
    except (PltHookError, OSError, ValueError) as exc:
        raise MooncakeUnavailable(f"the Mooncake engine cannot be kept on loopback here: {exc}") from exc
    cls = wrapper_class(sglang_root)
    try:
        engine = cls(hostname=hostname, gpu_id=0, ib_device=None)
    except Exception as exc:
        raise MooncakeUnavailable(f"sglang {version}'s MooncakeTransferEngine did not initialize: {exc}") from exc
    session_id = engine.get_session_id()
    if not isinstance(session_id, str) or "sandbox stub" in session_id:
        # A helper the wrapper needs that the sandbox still stubs: no peer could reach this engine.
        raise MooncakeUnavailable(f"sglang {version}'s MooncakeTransferEngine built the session id {session_id!r} "
                                  "from a helper the sandbox stubs")
    return engine
