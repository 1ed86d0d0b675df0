"""Which bytes of ``nixl/conn.py`` a release owns: the wheel's, the CPU-adapted ones, and the fix on either.

A real engine host runs the wheel's file; this machine's engine environments
(:mod:`forensics.engine.environment`) run it with the CPU adaptation ``cpu-nixl-dram``
(:mod:`forensics.engine.adaptations`), derived from the wheel's bytes the same way every time,
so with its own stable sha256. The fix's codemod applies to either. :class:`Release` holds the
four texts (each derived once, when first asked for), and :func:`classify` names a file by its
content alone: ``original``, ``cpu-adapted``, ``patched`` (on which base), or neither.

The adapted bytes register the KV pool as DRAM, which is right on this CPU and wrong on a GPU
host. So they are a baseline (what a deploy may start from and a rollback may put back) only
where :func:`adapted_baseline_problem` finds no problem: the file is on this machine, inside an
engine environment of this cache (the release's cached one or a deployment's clone of it), whose
own build record (``state.json``) says it adapted that file to exactly those bytes. Anywhere else
a DRAM-adapted file is a fork, and the deploy says why.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from patched_engine import remote_file

ORIGINAL = "original"
CPU_ADAPTED = "cpu-adapted"
BASE_TEXT = {ORIGINAL: "the original file", CPU_ADAPTED: "the CPU-adapted file"}
# <root>/venv/lib/python3.X/site-packages/...: how an engine environment lays out its interpreter
SITE_PACKAGES_RE = re.compile(r"^venv/lib/python3\.\d+/site-packages/")


def patched_bytes(data: bytes, version: str | None, label: str) -> tuple[bytes, object]:
    """The fix applied to ``data`` as the deploy writes it (line endings and encoding kept), and
    the codemod's result. Raises ``PatchError``/``ApplyError`` when the codemod refuses the file."""
    from patched_engine.apply import decode_source, normalize_newlines, restore_text_form
    from patched_engine.codemod import patch_source

    stored, form = decode_source(data, label)
    result = patch_source(normalize_newlines(stored), version)  # diff paths relative to site-packages
    new = restore_text_form(stored, result.new_text, form).encode(form.encoding) if result.changed else b""
    return new, result


@dataclass(frozen=True)
class Release:
    """A release's ``nixl/conn.py``: the wheel's bytes, and what derives from them (each once)."""

    version: str
    conn_bytes: bytes

    @property
    def sha256(self) -> str:
        return remote_file.sha256(self.conn_bytes)

    @cached_property
    def adapted_bytes(self) -> bytes:
        """The wheel's file with the CPU adaptation ``cpu-nixl-dram``: what an engine environment holds."""
        from forensics.engine.adaptations import NIXL_DRAM, AdaptationError

        try:
            text = self.conn_bytes.decode("utf-8")
            return NIXL_DRAM.apply(text, f"sglang {self.version}: nixl/conn.py").new_text.encode("utf-8")
        except (AdaptationError, UnicodeError):
            return b""  # a release the adaptation has no sites in: no file of it is "CPU-adapted"

    @property
    def adapted_sha256(self) -> str:
        return remote_file.sha256(self.adapted_bytes)

    @cached_property
    def fix_on_original(self) -> tuple[bytes, object]:
        """The fix on the wheel's file and the codemod's result ((b"", None): it does not apply)."""
        return _patched_or_nothing(self.conn_bytes, self.version, f"sglang {self.version}: nixl/conn.py")

    @cached_property
    def fix_on_adapted(self) -> tuple[bytes, object]:
        """The fix on the CPU-adapted file and the codemod's result ((b"", None): it does not apply)."""
        return _patched_or_nothing(self.adapted_bytes, self.version,
                                   f"sglang {self.version}: nixl/conn.py (CPU-adapted)")

    @property
    def patched_on_original(self) -> bytes:
        return self.fix_on_original[0]

    @property
    def patched_on_adapted(self) -> bytes:
        return self.fix_on_adapted[0]


def _patched_or_nothing(data: bytes, version: str, label: str) -> tuple[bytes, object]:
    from forensics.exitcodes import EnvironmentProblem
    from patched_engine.apply import ApplyError
    from patched_engine.codemod import PatchError

    if not data:
        return b"", None
    try:
        return patched_bytes(data, version, label)
    except (PatchError, ApplyError, EnvironmentProblem, UnicodeError):
        return b"", None  # a release the fix does not apply to: no file of it can be "the fix on" it


_releases: dict[tuple[str, str], Release] = {}


def release_conn(version: str) -> Release:
    """The pristine ``nixl/conn.py`` of ``version``'s wheel (SourceError, exit 4, when it cannot be had).

    Read (and checked against the wheel's RECORD) on every call; what derives from the same
    bytes is derived once per process (a codemod run takes seconds on these cores)."""
    from forensics.sglang_source import fetch

    source = fetch(version)
    data = source.verified_read_bytes(source.backend_file("nixl"))
    return _releases.setdefault((version, remote_file.sha256(data)), Release(version, data))


# ----------------------------------------------------------------------------- engine environments


def engine_environment_root(path: str | Path) -> Path | None:
    """The engine environment ``path`` (on this machine) lies in, or None.

    Two places hold one (the layout contract of docs/engine.md): the release's cached
    environment ``<cache>/engine/env/<release>-<hash>/`` and a deployment's hardlink clone of it
    ``<cache>/engine/deployments/<key>/env/``. The path is resolved first (symlinks followed)."""
    from forensics.cache import cache_dir

    engine = os.path.realpath(cache_dir() / "engine")
    resolved = os.path.realpath(path)
    if not resolved.startswith(engine + os.sep):
        return None
    parts = resolved[len(engine) + 1:].split(os.sep)
    if len(parts) >= 3 and parts[0] == "env" and not parts[1].startswith("."):
        return Path(engine, *parts[:2])
    if len(parts) >= 4 and parts[0] == "deployments" and parts[2] == "env":
        return Path(engine, *parts[:3])
    return None


def is_cached_environment(root: Path) -> bool:
    """Whether ``root`` is a release's cached engine environment (shared, kept pristine) rather than a clone."""
    return root.parent.name == "env"


def adapted_baseline_problem(release: Release, path: str | None, *, local: bool) -> str | None:
    """Why the CPU-adapted bytes are no baseline for the file at ``path``; None when they are.

    They are one only for a file on this machine (``local``), inside an engine environment
    (:func:`engine_environment_root`) whose build record says it adapted this very file to these
    bytes: a directory merely named like one, or an environment of another release, is not."""
    from forensics.engine.adaptations import NIXL_CONN, NIXL_DRAM

    why_not = "only an engine environment of this machine may hold it (a GPU host must never register KV as DRAM)"
    if path is None:
        return f"no file named; {why_not}"
    if not local:
        return f"{path} is on another host; {why_not}"
    root = engine_environment_root(path)
    if root is None:
        return f"{path} lies outside every engine environment of this machine's cache; {why_not}"
    relative = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    if not SITE_PACKAGES_RE.match(relative) or not relative.endswith(NIXL_CONN):
        return f"{path} is not the environment's own {NIXL_CONN} (venv/lib/python3.X/site-packages/); {why_not}"
    record_path = root / "state.json"
    try:
        record = json.loads(record_path.read_text())
        adapted = record["adapted"][NIXL_CONN]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (f"{record_path}: no build record of the adaptation {NIXL_DRAM.name} of {NIXL_CONN} "
                f"({type(exc).__name__}: {exc}); {why_not}")
    if not isinstance(adapted, dict) or adapted.get("sha256") != release.adapted_sha256:
        recorded = adapted.get("sha256") if isinstance(adapted, dict) else None
        return (f"{record_path} records the adapted {NIXL_CONN} as sha256 {str(recorded)[:12]}…, not "
                f"{release.adapted_sha256[:12]}… of sglang {release.version}'s (an environment of another release?)")
    return None


def accepted_baselines(version: str | None, release: Release | None, path: str | None = None, *,
                       local: bool = True) -> dict[str, str]:
    """The sha256 of every file a rollback may put back for ``version`` without ``force``, and what it is.

    The wheel's own ``nixl/conn.py`` (``release``, already fetched and checked against the
    wheel's RECORD); and, where :func:`adapted_baseline_problem` finds none, the same file with
    the CPU adaptation (an engine environment's baseline). Nowhere else."""
    if version is None or release is None:
        return {}
    baselines = {release.sha256: f"nixl/conn.py of the sglang {version} wheel"}
    if adapted_baseline_problem(release, path, local=local) is None:
        from forensics.engine.adaptations import NIXL_DRAM

        baselines[release.adapted_sha256] = (f"nixl/conn.py of the sglang {version} wheel with the CPU adaptation "
                                             f"{NIXL_DRAM.name} (an engine environment's baseline)")
    return baselines


# ----------------------------------------------------------------------------- classification


@dataclass(frozen=True)
class Classified:
    """What a file is, by content: ``kind`` original, cpu-adapted, patched or fork; ``base`` for a patched one."""

    kind: str
    base: str | None
    reason: str


def classify(data: bytes, release: Release, *, path: str | None, local: bool, marked: bool) -> Classified:
    """Name ``data`` (the engine's file, ``marked`` when it carries this deployer's ``PD_FORENSICS_PATCH``)
    by its bytes against the release's four texts; the adapted ones count only where they are a baseline."""
    from forensics.engine.adaptations import NIXL_DRAM

    version = release.version
    digest = remote_file.sha256(data)
    wheel = f"nixl/conn.py of the sglang {version} wheel"
    if data == release.conn_bytes:
        return Classified(ORIGINAL, None, f"byte-identical to {wheel} (sha256 {release.sha256[:12]}…)")
    if marked and data == release.patched_on_original:
        return Classified("patched", ORIGINAL, f"the fix applied to {wheel} (sha256 {digest[:12]}…)")
    adapted_ok = None
    if marked and data == release.patched_on_adapted:
        adapted_ok = adapted_baseline_problem(release, path, local=local)
        if adapted_ok is None:
            return Classified("patched", CPU_ADAPTED, f"the fix applied to {wheel} with the CPU adaptation "
                              f"{NIXL_DRAM.name} (sha256 {digest[:12]}…)")
        return Classified("fork", None, f"the fix on the CPU-adapted {wheel} (KV registered as DRAM), but "
                          f"{adapted_ok}: put the wheel's file back")
    if marked:
        return Classified("patched", None, f"carries the fix, but its other bytes are neither the fix on {wheel} "
                          "nor on its CPU-adapted form (edited after the deploy, or deployed with --force)")
    if data == release.adapted_bytes:
        adapted_ok = adapted_baseline_problem(release, path, local=local)
        if adapted_ok is None:
            return Classified(CPU_ADAPTED, None, f"byte-identical to {wheel} with the CPU adaptation {NIXL_DRAM.name} "
                              f"(sha256 {release.adapted_sha256[:12]}…), in an engine environment")
        return Classified("fork", None, f"the CPU-adapted {wheel} (KV registered as DRAM, adaptation "
                          f"{NIXL_DRAM.name}), but {adapted_ok}: put the wheel's file back")
    return Classified("fork", None, f"differs from {wheel} (sha256 {release.sha256[:12]}…) and from its CPU-adapted "
                      f"form (sha256 {release.adapted_sha256[:12]}…), this file {digest[:12]}…: a fork or a local "
                      "edit")
