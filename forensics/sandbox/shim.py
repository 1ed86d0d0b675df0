"""The import shim: load one release's real ``sglang.srt.disaggregation`` modules in this process.

``load_release(root)`` installs a meta-path finder that

* registers ``sglang`` and ``sglang.srt`` as bare packages from the release's tree, without
  running their ``__init__`` (those import torch, the server and every model);
* loads ``sglang.srt.disaggregation.*`` and ``sglang.srt.environ`` for real, from the tree
  (``disaggregation/nixl/conn.py`` from a replacement file when one is given: the patched run);
* serves stubs for exactly the modules listed for this release in :mod:`.stubs`;
* refuses everything else under ``sglang`` with :class:`UnexpectedImport`, naming the module
  and its importer.

NIXL: sglang imports ``nixl._api``/``nixl._bindings``. When the ``nixl_cu12`` wheel imports,
``nixl`` is aliased to it (real NIXL); otherwise ``nixl`` stays unimportable, which sglang
handles itself (stubbing it would break its ``except`` tuple of NIXL error classes).

One process holds one release: sglang's module names are global, so loading a second,
different release (or another conn file) in the same process raises :class:`SandboxError`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path

from forensics.sandbox.errors import SandboxError, UnexpectedImport
from forensics.sandbox.stubs import StubModule, StubRule, rules_for
from forensics.sglang_source import verify_file

DISAGGREGATION = "sglang.srt.disaggregation"
BARE_PACKAGES = ("sglang", "sglang.srt")
# Pure-Python modules outside disaggregation that it uses and that load here: real, even
# when their package is stubbed (``sglang.srt.utils.network`` builds the ZMQ addresses).
REAL_OUTSIDE_DISAGGREGATION = ("sglang.srt.environ", "sglang.srt.utils.network")
NIXL_CONN = f"{DISAGGREGATION}.nixl.conn"


@dataclass
class LoadedRelease:
    """What :func:`load_release` loaded: the release, its files and what was stubbed."""

    version: str
    root: Path
    nixl_conn: Path | None
    nixl: str  # "nixl_cu12 <version> (real)" or "unavailable"
    stubbed: dict[str, str] = field(default_factory=dict)  # module -> stub rule that covered it
    real: list[str] = field(default_factory=list)

    def module(self, name: str) -> types.ModuleType:
        """Import ``sglang.srt.disaggregation.<name>`` (e.g. ``"nixl.conn"``) for real."""
        full = name if name.startswith("sglang.") else f"{DISAGGREGATION}.{name}"
        try:
            return importlib.import_module(full)
        except SandboxError:
            raise
        except ImportError as exc:
            missing = getattr(exc, "name", None) or str(exc)
            raise SandboxError(f"sglang {self.version}: cannot import {full}: missing {missing} ({exc})") from exc


class _BarePackageLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):  # the package's __init__ is deliberately not run
        return None


class _StubLoader(importlib.abc.Loader):
    def __init__(self, rule: StubRule, release: LoadedRelease) -> None:
        self.rule = rule
        self.release = release

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []  # a package, so `import torch.distributed` also resolves to a stub
        return module

    def exec_module(self, module):
        self.release.stubbed[module.__name__] = self.rule.module
        return None


def _importer() -> str | None:
    """The module whose import statement triggered the current find_spec (for error messages)."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith("<frozen") or "importlib" in filename or filename == __file__):
            name = frame.f_globals.get("__name__")
            return f"{name} ({Path(filename).name}:{frame.f_lineno})" if name else filename
        frame = frame.f_back
    return None


class ReleaseFinder(importlib.abc.MetaPathFinder):
    def __init__(self, release: LoadedRelease) -> None:
        self.release = release
        self.rules = rules_for(release.version)
        self.stub_tops = {rule.module.split(".")[0] for rule in self.rules}

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top == "nixl" and nixl_disabled():
            raise ModuleNotFoundError(f"No module named {fullname!r} ({NIXL_SWITCH_ENV}=off)", name=fullname)
        if top != "sglang" and top not in self.stub_tops:
            return None
        if fullname in REAL_OUTSIDE_DISAGGREGATION:
            file = self.release.root.joinpath(*fullname.split(".")).with_suffix(".py")
            if file.is_file():
                verify_file(file)  # a cached release's file: checked against its recorded sha256
                self.release.real.append(fullname)
                return importlib.util.spec_from_file_location(fullname, file)
        for rule in self.rules:
            if rule.covers(fullname):
                return importlib.machinery.ModuleSpec(
                    fullname, _StubLoader(rule, self.release), is_package=True
                )
        if top != "sglang":
            return None
        if fullname in BARE_PACKAGES:
            directory = self.release.root.joinpath(*fullname.split("."))
            spec = importlib.machinery.ModuleSpec(fullname, _BarePackageLoader(), is_package=True)
            spec.submodule_search_locations = [str(directory)]
            return spec
        if fullname == NIXL_CONN and self.release.nixl_conn is not None:
            return importlib.util.spec_from_file_location(fullname, self.release.nixl_conn)
        if fullname == DISAGGREGATION or fullname.startswith(DISAGGREGATION + "."):
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None:
                relative = Path(*fullname.split("."))
                raise SandboxError(
                    f"sglang {self.release.version}: {fullname} is not in the tree at {self.release.root} "
                    f"(no {relative}.py or {relative}/; imported by {_importer()})"
                )
            if spec.has_location and spec.origin:
                verify_file(spec.origin)  # a cached release's file: checked against its recorded sha256
            self.release.real.append(fullname)
            return spec
        raise UnexpectedImport(fullname, _importer(), self.release.version)


_lock = threading.Lock()
_loaded: LoadedRelease | None = None


def _version_of(root: Path) -> str:
    """The release number of a tree: the wheel cache's manifest, else ``_version.py``/``version.py``."""
    manifest = root.parent / "manifest.json"
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
        except ValueError:  # a corrupt manifest: fall back to the version files
            data = None
        version = data.get("version") if isinstance(data, dict) else None
        if isinstance(version, str) and version:
            return version
    for name in ("_version.py", "version.py"):
        path = root / "sglang" / name
        if path.is_file():
            match = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", path.read_text(errors="replace"), re.M)
            if match and match.group(1) != "0.0.0.dev0":
                return match.group(1)
    raise SandboxError(f"{root}: cannot tell which sglang release this is (no manifest.json or version file); pass version=")


NIXL_SWITCH_ENV = "PD_FORENSICS_SANDBOX_NIXL"  # "off": behave as on a machine without NIXL


def nixl_disabled() -> bool:
    return os.environ.get(NIXL_SWITCH_ENV, "").lower() in ("off", "0", "no", "false")


def _alias_nixl() -> str:
    """Make ``import nixl._api`` give the real NIXL from the nixl_cu12 wheel, if it imports."""
    if nixl_disabled():
        return f"disabled ({NIXL_SWITCH_ENV}=off): nixl is unimportable"
    if importlib.util.find_spec("nixl") is not None:
        import nixl  # noqa: F401  (a real `nixl` install wins)

        return f"nixl {getattr(sys.modules['nixl'], '__version__', '')} (real)".replace("  ", " ")
    try:
        package = importlib.import_module("nixl_cu12")
        api = importlib.import_module("nixl_cu12._api")
        bindings = importlib.import_module("nixl_cu12._bindings")
    except ImportError:
        return "unavailable"
    sys.modules["nixl"] = package
    sys.modules["nixl._api"] = api
    sys.modules["nixl._bindings"] = bindings
    try:
        from importlib.metadata import version

        return f"nixl_cu12 {version('nixl-cu12')} (real)"
    except Exception:
        return "nixl_cu12 (real)"


def install_logger_once_methods() -> None:
    """``Logger.warning_once`` and ``info_once``, which sglang's disaggregation code calls (the
    ABORT_ACK listener, the heartbeat, the NIXL notification parser): in a real engine they come
    from ``transformers``, whose logging module adds them to ``logging.Logger`` when sglang imports
    it. Neither is imported here, and without them such a call raises AttributeError in the
    thread that makes it: a death the engine never has. Each message is logged once per logger."""
    if hasattr(logging.Logger, "warning_once"):
        return
    seen: set[tuple[str, str, str]] = set()
    seen_lock = threading.Lock()

    def once(level: int):
        def log_once(self, msg, *args, **kwargs):
            key = (self.name, logging.getLevelName(level), str(msg))
            with seen_lock:
                if key in seen:
                    return
                seen.add(key)
            kwargs.setdefault("stacklevel", 2)  # the record names sglang's line, not this one
            self.log(level, msg, *args, **kwargs)
        return log_once

    logging.Logger.warning_once = once(logging.WARNING)  # type: ignore[attr-defined]
    logging.Logger.info_once = once(logging.INFO)  # type: ignore[attr-defined]


def load_release(
    source_root: str | Path, *, nixl_conn: str | Path | None = None, version: str | None = None
) -> LoadedRelease:
    """Install the shim for the release at ``source_root`` (the directory holding ``sglang/srt``).

    ``nixl_conn`` replaces ``disaggregation/nixl/conn.py`` (a patched copy). Idempotent for
    the same arguments; a different release in the same process raises :class:`SandboxError`.
    """
    global _loaded
    root = Path(source_root).resolve()
    if not (root / "sglang" / "srt").is_dir():
        raise SandboxError(f"{root}: has no sglang/srt tree")
    conn = Path(nixl_conn).resolve() if nixl_conn is not None else None
    if conn is not None and not conn.is_file():
        raise SandboxError(f"replacement nixl/conn.py {conn} does not exist")
    release_version = version or _version_of(root)
    with _lock:
        if _loaded is not None:
            if (_loaded.root, _loaded.nixl_conn) == (root, conn):
                return _loaded
            raise SandboxError(
                f"this process already holds sglang {_loaded.version} from {_loaded.root}"
                f"{' with ' + str(_loaded.nixl_conn) if _loaded.nixl_conn else ''}; "
                "one release per process (use EngineSandbox for a fresh interpreter)"
            )
        foreign = sorted(name for name in sys.modules if name == "sglang" or name.startswith("sglang."))
        if foreign:
            raise SandboxError(f"sglang is already imported in this process ({foreign[0]}); cannot shim it")
        release = LoadedRelease(version=release_version, root=root, nixl_conn=conn, nixl=_alias_nixl())
        install_logger_once_methods()
        sys.meta_path.insert(0, ReleaseFinder(release))
        _loaded = release
        return release


def loaded_release() -> LoadedRelease | None:
    return _loaded
