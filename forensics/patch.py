"""``fx.patch``: the NIXL bootstrap-loop fix from Python: diff, apply, verify, deploy.

A thin facade over :mod:`patched_engine` (the libcst codemod and what is built on it), with
the same behaviour as ``forensics patch ...`` on the command line::

    import forensics as fx

    print(fx.patch.diff("0.5.15"))            # the unified diff for review
    fx.patch.verify("0.5.15").status          # "pass": unpatched dies, patched stays alive
    fx.patch.apply(".../nixl/conn.py")        # the plan; yes=True writes (backup first)
    fx.patch.deploy("inventory.toml")         # plan and diff; yes=True rolls it out

Every function loads :mod:`patched_engine` (libcst) on first call, so ``import forensics``
stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from patched_engine.apply import ApplyResult
    from patched_engine.codemod import PatchResult
    from patched_engine.deploy import DeployRecord, StatusReport
    from patched_engine.remote_file import Step
    from patched_engine.verify import VerifyResult

__all__ = ["apply", "codemod", "deploy", "diff", "rollback", "status", "verify"]

DEFAULT_LIVENESS_DEADLINE_S = 600.0  # patched_engine.deploy's default: a real engine restart can take minutes


def codemod(release: Any = "0.5.15") -> PatchResult:
    """The codemod run on a release's ``nixl/conn.py``: its steps (applied, skipped, why) and ``.diff``.

    ``release`` is a release number, ``"installed"``, a directory holding ``sglang/srt`` or an
    ``SglangSource``. Raises :class:`~patched_engine.codemod.PatchError` when the codemod
    refuses the file (an anchor it needs is missing), ``SourceError`` when the release
    cannot be had. Renders its step table in a notebook.

    Example: ``fx.patch.codemod("0.5.15").steps``
    """
    from forensics.handlers import resolve_source
    from patched_engine.codemod import patch_source

    source = resolve_source(release)
    path = source.backend_file("nixl")
    return patch_source(path.read_text(encoding="utf-8"), source.version)


def diff(release: Any = "0.5.15") -> str:
    """The unified diff the fix makes to a release's ``nixl/conn.py`` (empty when already patched).

    It applies with ``patch -p1`` under site-packages, like ``forensics patch diff``.

    Example: ``print(fx.patch.diff("0.5.15"))``
    """
    return codemod(release).diff


def apply(path: str | Path, *, yes: bool = False, backup_dir: str | Path | None = None,
          release: str | None = None) -> ApplyResult:
    """Patch a local ``nixl/conn.py`` in place; without ``yes=True`` only the plan, nothing written.

    With ``yes=True``: a backup (sha256 recorded beside it, or in ``backup_dir``), then an
    atomic replace after a compile check; owner, mode, line endings and encoding kept.
    ``.status`` is ``"planned"``, ``"applied"`` or ``"already-patched"``. Raises
    :class:`~patched_engine.codemod.PatchError` when the codemod refuses the file.

    Example: ``fx.patch.apply("site-packages/sglang/srt/disaggregation/nixl/conn.py", yes=True).status``
    """
    from patched_engine.apply import apply_file

    return apply_file(path, yes=yes, backup_dir=backup_dir, release=release)


def verify(release: Any = "0.5.15", *, nixl: bool = True) -> VerifyResult:
    """Run the ABORT/foreign-frame scenario on the unpatched and the patched file in the engine sandbox.

    ``.status`` is ``"pass"`` when the unpatched thread dies and the patched one stays alive
    with room 2 Failed and rooms 3-4 WaitingForInput, ``"fail"`` when it does not,
    ``"inconclusive"`` when the check could not run (``.reasons`` says why).
    ``nixl=False`` uses the recording stand-in agent instead of real NIXL over UCX;
    ``.agent`` names the agent that ran.

    Example: ``fx.patch.verify("0.5.15").patched.final_states``
    """
    from patched_engine.verify import verify_release

    return verify_release(str(release), nixl=nixl)


def deploy(inventory: Any, *, yes: bool = False, force: bool = False, restart: bool = False,
           restart_decodes: bool | None = None, liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S,
           on_step: Callable[[Step], None] | None = None) -> DeployRecord:
    """Patch every prefill engine of a deployment (inventory path, Inventory or twin).

    A live deployment gets the plan and each engine's diff only, unless ``yes=True``; a twin
    is deployed at once. Each engine: the file checked against the release's wheel (a fork
    is refused without ``force=True``), backup, atomic write, compile check, bytecode
    cleared, restart, and a real one-token request within ``liveness_deadline_s``. The plan
    warns of decodes whose release blocks on a restarted prefill (sglang 0.5.15);
    ``restart_decodes=True`` restarts those after the prefills, ``None`` (the default) only on a
    real-engine deployment of ours (the plan says why), ``False`` never.
    ``on_step`` is called with each step as it ends. ``.status`` and ``.exit_status`` say
    how it went.

    Example: ``fx.patch.deploy(twin).status``
    """
    from patched_engine.deploy import deploy as deploy_engines

    return deploy_engines(inventory, yes=yes, force=force, restart=restart, restart_decodes=restart_decodes,
                          liveness_deadline_s=liveness_deadline_s, on_step=on_step)


def status(inventory: Any) -> StatusReport:
    """Per prefill engine: ``original``, ``cpu-adapted``, ``patched`` (on which, and running it),
    ``patched-not-running`` or ``unknown``.

    Example: ``fx.patch.status("inventory.toml").word``
    """
    from patched_engine.deploy import status as engine_status

    return engine_status(inventory)


def rollback(inventory: Any, *, yes: bool = False, force: bool = False, restart_decodes: bool | None = None,
             liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S,
             on_step: Callable[[Step], None] | None = None) -> DeployRecord:
    """Put each prefill's newest backup back byte for byte, restart, wait for liveness.

    The backup must be the release's own file (its sha256 that of the wheel's ``nixl/conn.py``);
    anything else is refused unless ``force=True``.

    Like :func:`deploy`, a live deployment gets the plan only unless ``yes=True``.

    Example: ``fx.patch.rollback(twin).status``
    """
    from patched_engine.deploy import rollback as roll_back

    return roll_back(inventory, yes=yes, force=force, restart_decodes=restart_decodes,
                     liveness_deadline_s=liveness_deadline_s, on_step=on_step)
