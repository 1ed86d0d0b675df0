"""The source of one sglang release, from a cached PyPI wheel, an install or a checkout.

sglang is never a dependency of PD Forensics (its wheel declares torch). We read,
run and patch its disaggregation code from one of three places:

* a wheel fetched with ``pip download --no-deps sglang==X`` into the cache, kept with
  its sha256, only ``sglang/srt/`` unpacked, read-only, and checked on every reuse
  against the size, mtime and sha256 recorded per file at unpack time (``fetch``,
  :func:`verified_read_bytes`; see "wheels" below);
* the sglang installed in an interpreter (``from_installed``);
* a directory: a git checkout or any tree holding ``sglang/srt`` (``from_directory``).

Every path returns one :class:`SglangSource`, which knows where each backend's
files are.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from packaging.version import InvalidVersion, Version

from forensics.cache import ENV_VAR, cache_dir
from forensics.exitcodes import EnvironmentProblem, UsageProblem

DISAGGREGATION = Path("sglang/srt/disaggregation")
# The files of one backend that the handler map, the sandbox and the patch read.
BACKEND_FILES = ("conn.py",)
SHARED_FILES = {
    "common": DISAGGREGATION / "common" / "conn.py",
    "base": DISAGGREGATION / "base" / "conn.py",
}
PYPI_JSON = "https://pypi.org/pypi/sglang/json"


class SourceError(EnvironmentProblem):
    """A release's source could not be found, fetched or read; the message says which and why."""


@dataclass(frozen=True)
class SglangSource:
    """One sglang release's source tree (the directory that holds ``sglang/srt``)."""

    version: str
    root: Path
    origin: str  # "wheel", "installed" or "directory"
    sha256: str | None = None  # of the wheel, when it came from one
    wheel_name: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def srt(self) -> Path:
        return self.root / "sglang" / "srt"

    @property
    def disaggregation(self) -> Path:
        return self.root / DISAGGREGATION

    def backends(self) -> list[str]:
        """Backend directories that have a ``conn.py`` (nixl, mooncake, mori, ...)."""
        if not self.disaggregation.is_dir():
            return []
        return sorted(
            p.name
            for p in self.disaggregation.iterdir()
            if p.is_dir() and (p / "conn.py").is_file() and p.name not in ("base", "common")
        )

    def backend_file(self, backend: str, name: str = "conn.py") -> Path:
        """Path of ``disaggregation/<backend>/<name>``; raises naming the path if absent."""
        path = self.disaggregation / backend / name
        if not path.is_file():
            raise SourceError(
                f"sglang {self.version} ({self.origin} at {self.root}) has no {DISAGGREGATION / backend / name}"
            )
        self.verify(path)
        return path

    def shared_file(self, which: str) -> Path:
        """``common`` or ``base`` conn.py (``common`` exists from 0.5.9; raises when absent)."""
        path = self.root / SHARED_FILES[which]
        if not path.is_file():
            raise SourceError(f"sglang {self.version} ({self.origin} at {self.root}) has no {SHARED_FILES[which]}")
        self.verify(path)
        return path

    @property
    def files(self) -> dict[str, Path]:
        """Every backend conn.py plus common/base, keyed ``nixl``, ``mooncake``, ``common`` ..."""
        found = {b: self.disaggregation / b / "conn.py" for b in self.backends()}
        for key, rel in SHARED_FILES.items():
            if (self.root / rel).is_file():
                found[key] = self.root / rel
        return found

    def read(self, relative: str | Path) -> str:
        return self.verified_read_bytes(relative).decode("utf-8")

    def verified_read_bytes(self, path: str | Path) -> bytes:
        """The bytes of ``path`` (absolute, or relative to :attr:`root`). For a release from the
        wheel cache they are first checked against the sha256 recorded at unpack time (a damaged
        tree is restored, or :class:`CacheIntegrityError` names the file): read the cache's
        files through here, never with a bare ``read_text``."""
        path = self.root / path
        try:
            return verified_read_bytes(path)
        except FileNotFoundError as exc:
            raise SourceError(f"sglang {self.version}: {path} does not exist", path=str(path)) from exc

    def verified_read_text(self, path: str | Path) -> str:
        return self.verified_read_bytes(path).decode("utf-8")

    def tree(self, relative: str | Path) -> ast.Module:
        """The parsed module at ``relative`` (read through :meth:`verified_read_bytes`), parsed once per
        file content: the parse cache every new reader of a release's source shares."""
        data = self.verified_read_bytes(relative)
        return _parsed(hashlib.sha256(data).digest(), data, str(relative))

    def verify(self, path: str | Path) -> None:
        """Check one file (see :meth:`verified_read_bytes`); raises if it cannot be trusted."""
        self.verified_read_bytes(path)


@lru_cache(maxsize=512)
def _parsed(digest: bytes, data: bytes, filename: str) -> ast.Module:
    """One parse per distinct file content (the digest keys it; ``data`` and ``filename`` ride along).
    Callers must not change the tree they get."""
    del digest
    return ast.parse(data, filename=filename)


# --------------------------------------------------------------------------- wheels
#
# One release in the cache (``<cache>/sglang/<version>/``):
#
#     manifest.json   version, wheel name, the wheel's sha256, and per unpacked file its size,
#                     mtime (ns) and sha256 ("files": {"sglang/srt/...": [size, mtime_ns, sha256]})
#     <wheel>.whl     the wheel itself, kept so that a damaged tree is re-unpacked without a network
#     src/            sglang/srt/** and sglang's version files, every file read-only
#
# Every reuse checks the tree against the manifest: ``fetch``/``cached`` stat every file (size and
# mtime, and that no file was added or removed) and every read of a file through
# :func:`verified_read_bytes` hashes the bytes it returns. A mismatch re-unpacks the release from
# the kept wheel (its sha256 checked) or, without it, from a fresh download with the same sha256;
# when neither can be had the read stops with a :class:`CacheIntegrityError` naming the file.

MANIFEST_FORMAT = 2
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class CacheIntegrityError(SourceError):
    """A cached release no longer matches what was unpacked (or its manifest is corrupt) and could
    not be restored; the message and ``path`` name the file (exit 4)."""


def _wheel_cache() -> Path:
    path = cache_dir() / "sglang"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise fetches of one release across processes (parallel tests share the cache).

    The lock file is removed on the way out (while still locked), so nothing is left behind;
    a waiter that wakes up holding a lock on a file that was meanwhile unlinked tries again.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        except BaseException:
            os.close(fd)
            raise
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)  # releases the lock


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_version(version: str) -> str:
    if not str(version).strip():
        raise UsageProblem(
            "an empty sglang release was given (e.g. --sglang \"\"): give a release number such as 0.5.15, "
            "a directory holding sglang/srt, or 'installed'"
        )
    try:
        Version(version)
    except InvalidVersion as exc:
        raise SourceError(f"{version!r} is not a valid sglang release number") from exc
    if not re.fullmatch(r"[0-9A-Za-z.+-]+", version):
        raise SourceError(f"{version!r} is not a valid sglang release number")
    return version


# Parsed manifests, keyed by path and the manifest file's identity (it is replaced, never edited).
_manifests: dict[str, tuple[tuple[int, int, int], dict]] = {}


def _load_manifest(release_dir: Path) -> dict | None:
    """The release's manifest, checked for shape; None when there is none.

    Raises :class:`SourceError` (exit 4) naming the file when it cannot be read or is not a
    manifest (invalid JSON, wrong types): the cache cannot vouch for that release.
    """
    path = release_dir / "manifest.json"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the cache manifest: {exc.strerror or exc}", path=str(path)) from exc
    identity = (st.st_ino, st.st_size, st.st_mtime_ns)
    memo = _manifests.get(str(path))
    if memo is not None and memo[0] == identity:
        return memo[1]
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the cache manifest: {exc.strerror or exc}", path=str(path)) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CacheIntegrityError(
            f"{path}: the cache manifest is corrupt ({exc}); remove {release_dir} to fetch the release again",
            path=str(path),
        ) from exc
    problem = _manifest_problem(data, release_dir.name)
    if problem:
        raise CacheIntegrityError(
            f"{path}: the cache manifest is corrupt ({problem}); remove {release_dir} to fetch the release again",
            path=str(path),
        )
    _manifests[str(path)] = (identity, data)
    return data


def _manifest_problem(data: object, version: str) -> str | None:
    if not isinstance(data, dict):
        return f"a JSON object was expected, not {type(data).__name__}"
    for key in ("version", "wheel", "sha256"):
        if not isinstance(data.get(key), str):
            return f"{key!r} is {type(data.get(key)).__name__}, not a string"
    if data["version"] != version:
        return f"it is the manifest of {data['version']!r}, in the folder of {version!r}"
    if not SHA256_HEX.fullmatch(data["sha256"]):
        return "'sha256' is not 64 hex digits"
    if "/" in data["wheel"] or not data["wheel"].endswith(".whl"):
        return "'wheel' is not a wheel's file name"
    files = data.get("files")
    if files is None:
        return None  # an older cache format: fetch() re-unpacks it to get the records
    if not isinstance(files, dict):
        return f"'files' is {type(files).__name__}, not an object"
    for name, record in files.items():
        if not (
            isinstance(record, list) and len(record) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) for v in record[:2])
            and isinstance(record[2], str) and SHA256_HEX.fullmatch(record[2])
        ):
            return f"the record of {name!r} is not [size, mtime_ns, sha256]"
    return None


def _walk(src: Path) -> dict[str, os.stat_result]:
    """Every entry of the unpacked tree that is not a directory (symlinks included, not followed),
    keyed by its path relative to ``src``; ``__pycache__`` folders are not part of the release."""
    found: dict[str, os.stat_result] = {}
    pending = [(str(src), "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                name = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append((entry.path, name + "/"))
                else:  # files, and symlinks (to a file or a directory): an entry to compare
                    found[name] = entry.stat(follow_symlinks=False)
    return found


def _tree_problem(release_dir: Path, manifest: dict) -> tuple[str, Path] | None:
    """The first way the unpacked tree differs from its manifest (size, mtime, added or missing
    file), with the file; None when every file matches. A stat walk: nothing is hashed here."""
    src = release_dir / "src"
    records = manifest.get("files")
    if records is None:
        return ("the cache manifest records no per-file size, mtime and sha256 (an older cache format)",
                release_dir / "manifest.json")
    if not src.is_dir():
        return f"{src} is missing", src
    seen = _walk(src)
    for name, record in records.items():
        st = seen.get(name)
        path = src / name
        if st is None:
            return f"{path} is missing", path
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is no longer a regular file", path
        if st.st_size != record[0]:
            return f"{path} changed after it was unpacked (size {st.st_size}, unpacked {record[0]})", path
        if st.st_mtime_ns != record[1]:
            return f"{path} changed after it was unpacked (modified since unpack)", path
    extra = sorted(set(seen) - set(records))
    if extra:
        return f"{src / extra[0]} was added after the release was unpacked", src / extra[0]
    return None


def _source_of(version: str, release_dir: Path, manifest: dict) -> SglangSource:
    return SglangSource(
        version=version, root=release_dir / "src", origin="wheel", sha256=manifest["sha256"],
        wheel_name=manifest["wheel"],
    )


def cached(version: str) -> SglangSource | None:
    """The cached source of ``version`` if it is unpacked and its tree matches its manifest
    (size and mtime of every file), else None (no network; :func:`fetch` restores it)."""
    release_dir = _wheel_cache() / _check_version(version)
    manifest = _load_manifest(release_dir)
    if manifest is None or _tree_problem(release_dir, manifest) is not None:
        return None
    return _source_of(version, release_dir, manifest)


def wheel_sha256(version: str) -> str | None:
    """The sha256 of the wheel the cached ``version`` was unpacked from (its manifest's), or None
    when the release is not in the cache. Reads no tree: for keying what is derived from it."""
    manifest = _load_manifest(_wheel_cache() / _check_version(version))
    return manifest["sha256"] if manifest is not None else None


def fetch(version: str, *, offline: bool = False) -> SglangSource:
    """The source of sglang ``version`` from its PyPI wheel, downloaded once into the cache.

    Only ``sglang/srt/`` is unpacked; the wheel and its sha256 are kept beside it. Every call
    checks the unpacked tree against the manifest (see the module's cache notes) and restores
    it from the kept wheel (or the same wheel downloaded again) when it differs. Raises
    :class:`SourceError` naming the release when it cannot be fetched, and
    :class:`CacheIntegrityError` naming the file when a damaged tree cannot be restored.
    """
    version = _check_version(version)
    release_dir = _wheel_cache() / version
    manifest = _load_manifest(release_dir)
    if manifest is not None and _tree_problem(release_dir, manifest) is None:
        return _source_of(version, release_dir, manifest)
    with _locked(_wheel_cache() / f".{version}.lock"):
        _install(version, offline=offline)
    manifest = _load_manifest(release_dir)
    assert manifest is not None
    return _source_of(version, release_dir, manifest)


def _install(version: str, *, offline: bool, damaged: tuple[str, Path] | None = None) -> None:
    """Under the release's lock: (re)build its cache folder unless it is (now) sound.

    ``damaged``: a problem found by hashing a file (which the stat walk cannot see); the
    release is re-unpacked even though its tree's sizes and mtimes match.
    """
    cache = _wheel_cache()
    release_dir = cache / version
    for stale in cache.glob(f".tmp-{version}-*"):  # a fetch killed midway; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    manifest = _load_manifest(release_dir)
    problem = None
    if manifest is not None:
        problem = _tree_problem(release_dir, manifest)
        if problem is None and damaged is not None:
            path = damaged[1]
            record = manifest["files"].get(str(path.relative_to((release_dir / "src").resolve())))
            problem = damaged if record is None or not path.is_file() or _sha256(path) != record[2] else None
        if problem is None:
            return  # sound (perhaps restored by another process meanwhile)
    else:
        if release_dir.is_dir() and not release_dir.is_symlink():  # a failed fetch's leftover (older
            shutil.rmtree(release_dir, ignore_errors=True)          # versions left an empty folder)
        if offline:
            raise SourceError(f"sglang {version} is not in the cache ({release_dir}) and offline mode is on",
                              path=str(release_dir))
    with tempfile.TemporaryDirectory(prefix=f".tmp-{version}-", dir=cache) as tmp:
        staging = Path(tmp) / "release"
        staging.mkdir()
        wheel = None
        if manifest is not None:
            kept = release_dir / manifest["wheel"]
            if kept.is_file() and _sha256(kept) == manifest["sha256"]:
                wheel = staging / kept.name
                shutil.copy2(kept, wheel)
            elif offline:
                raise CacheIntegrityError(
                    f"sglang {version} in the cache cannot be trusted: {problem[0]}; it cannot be restored "
                    f"offline ({kept} is missing or does not match its sha256)", path=str(problem[1]))
        if wheel is None:
            try:
                wheel = _download_wheel(version, Path(tmp) / "download")
            except SourceError as exc:
                if problem is None:
                    raise
                raise CacheIntegrityError(
                    f"sglang {version} in the cache cannot be trusted: {problem[0]}; it could not be restored: {exc}",
                    path=str(problem[1])) from exc
            digest = _sha256(wheel)
            if manifest is not None and digest != manifest["sha256"]:
                raise CacheIntegrityError(
                    f"sglang {version} in the cache cannot be trusted: {problem[0]}; the wheel downloaded to "
                    f"restore it ({wheel.name}) has sha256 {digest}, not the {manifest['sha256']} recorded "
                    f"in {release_dir / 'manifest.json'}", path=str(problem[1]))
            wheel = Path(shutil.move(str(wheel), staging / wheel.name))
        files = _unpack_srt(wheel, staging / "src")
        wheel.chmod(wheel.stat().st_mode & ~WRITE_BITS)
        record = {
            "format": MANIFEST_FORMAT, "version": version, "wheel": wheel.name, "sha256": _sha256(wheel),
            "unpacked": "sglang/srt", "files": files,
        }
        (staging / "manifest.json").write_text(json.dumps(record, indent=1, sort_keys=True))
        (staging / "manifest.json").chmod(0o444)
        # Swap in: the old folder (if any) moves into the temporary directory, which removes it.
        if release_dir.exists() or release_dir.is_symlink():
            os.replace(release_dir, Path(tmp) / "old")
        os.replace(staging, release_dir)


def _download_wheel(version: str, dest: Path) -> Path:
    """``pip download`` the release's wheel into ``dest``; raises :class:`SourceError` naming it."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", "--dest", str(dest), f"sglang=={version}",
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise SourceError(f"could not fetch sglang {version} with pip download: timed out after 600 s") from exc
    wheels = sorted(dest.glob("sglang-*.whl"))
    if proc.returncode != 0 or not wheels:
        reason = (proc.stderr or proc.stdout).strip().splitlines()
        raise SourceError(
            f"could not fetch sglang {version} with pip download: "
            f"{reason[-1] if reason else f'exit status {proc.returncode}'}"
        )
    return wheels[0]


WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def _unpack_srt(wheel: Path, dest: Path) -> dict[str, list]:
    """Extract ``sglang/srt/**`` (and the package's ``version.py``) from a wheel, nothing else.

    Returns each extracted file's [size, mtime_ns, sha256], keyed by its path under ``dest``.
    Every file is left read-only (a-w). That stops accidents by ordinary users only: root writes
    read-only files all the same, so what guarantees integrity is the size/mtime walk on every
    reuse and the sha256 check of every file read (:func:`verified_read_bytes`).
    """
    records: dict[str, list] = {}
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                name = member.filename
                if not (name.startswith("sglang/srt/") or name in ("sglang/version.py", "sglang/_version.py")):
                    continue
                target = (dest / name).resolve()
                if not str(target).startswith(str(dest.resolve()) + os.sep):
                    raise SourceError(f"{wheel.name}: refusing path outside the tree: {name}")
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with archive.open(member) as src, open(target, "wb") as out:
                    for block in iter(lambda: src.read(1 << 20), b""):  # noqa: B023 - consumed in this iteration
                        digest.update(block)
                        out.write(block)
                target.chmod(target.stat().st_mode & ~WRITE_BITS)
                st = target.stat()
                records[str(target.relative_to(dest.resolve()))] = [st.st_size, st.st_mtime_ns, digest.hexdigest()]
    except zipfile.BadZipFile as exc:
        raise SourceError(f"{wheel}: not a valid wheel ({exc})") from exc
    if not (dest / "sglang" / "srt").is_dir():
        raise SourceError(f"{wheel.name}: has no sglang/srt/ tree")
    return records


# ------------------------------------------------------------------ verified reads


_resolved_cache: dict[str, str] = {}


def _cache_location(path: Path) -> tuple[str, Path, Path] | None:
    """(version, release folder, resolved path) when ``path`` lies in a cached release's tree."""
    configured = os.environ.get(ENV_VAR, "")
    root = _resolved_cache.get(configured)
    if root is None:
        root = _resolved_cache[configured] = os.path.realpath(_wheel_cache())
    resolved = os.path.realpath(path)
    if not resolved.startswith(root + os.sep):
        return None
    parts = resolved[len(root) + 1:].split(os.sep)
    if len(parts) < 3 or parts[1] != "src" or parts[0].startswith("."):
        return None
    return parts[0], Path(root) / parts[0], Path(resolved)


def verified_read_bytes(path: str | Path) -> bytes:
    """The bytes of ``path``; when it lies in a cached release, checked against the sha256
    recorded at unpack time first. A mismatch restores the release (see :func:`fetch`) and
    reads again; when it cannot be restored, raises :class:`CacheIntegrityError` naming the
    file. Outside the cache (an install, a checkout) the file is read as it is.
    """
    path = Path(path)
    where = _cache_location(path)
    if where is None:
        return path.read_bytes()
    version, release_dir, resolved = where
    relative = str(resolved.relative_to(release_dir / "src"))
    for attempt in (1, 2):
        manifest = _load_manifest(release_dir)
        if manifest is None:
            raise CacheIntegrityError(
                f"{resolved}: sglang {version} has no manifest in the cache ({release_dir / 'manifest.json'}), "
                "so this file cannot be checked", path=str(resolved))
        records = manifest.get("files")
        record = records.get(relative) if records is not None else None
        if records is not None and record is None:
            if not resolved.exists():
                return path.read_bytes()  # not part of the release: FileNotFoundError, as for any path
            problem = f"{resolved} is not a file of sglang {version} as unpacked (added later)"
        else:
            try:
                data = resolved.read_bytes()
            except FileNotFoundError:
                data = None
            if record is not None and data is not None and hashlib.sha256(data).hexdigest() == record[2]:
                return data
            if records is None:
                problem = "the cache manifest records no sha256 per file (an older cache format)"
            elif data is None:
                problem = f"{resolved} is missing"
            else:
                problem = f"{resolved} changed after it was unpacked (its sha256 differs from the one recorded)"
        if attempt == 2:
            raise CacheIntegrityError(f"sglang {version} in the cache cannot be trusted: {problem}",
                                      path=str(resolved))
        with _locked(_wheel_cache() / f".{version}.lock"):
            _install(version, offline=False, damaged=(problem, resolved))
    raise AssertionError("unreachable")


def verified_read_text(path: str | Path) -> str:
    """:func:`verified_read_bytes`, decoded as UTF-8."""
    return verified_read_bytes(path).decode("utf-8")


def verify_file(path: str | Path) -> None:
    """Check one file of a cached release against its recorded sha256 (restoring the release
    when it differs); nothing to check outside the cache."""
    verified_read_bytes(path)


def _read_release_index(path: Path) -> list[str] | None:
    """The cached list of releases on PyPI; None when it is unreadable or not a list of strings."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, list) and all(isinstance(v, str) for v in data) else None


def available_releases(
    lower: str | None = None, upper: str | None = None, *, include_prereleases: bool = False
) -> list[str]:
    """sglang releases on PyPI (cached for a day), oldest first, optionally within [lower, upper]."""
    index_file = _wheel_cache() / "pypi-releases.json"
    releases: list[str] | None = None
    import time

    if index_file.is_file() and time.time() - index_file.stat().st_mtime < 86400:
        releases = _read_release_index(index_file)
    if releases is None:
        try:
            with urllib.request.urlopen(PYPI_JSON, timeout=30) as response:
                data = json.load(response)
            releases = [v for v, files in data["releases"].items() if any(f.get("packagetype") == "bdist_wheel" for f in files)]
            index_file.write_text(json.dumps(releases))
        except Exception as exc:  # network refused, DNS, bad JSON: fall back to what is cached
            releases = _read_release_index(index_file) if index_file.is_file() else None
            if releases is None:
                local = sorted(p.name for p in _wheel_cache().iterdir() if (p / "manifest.json").is_file())
                if not local:
                    raise SourceError(f"cannot list sglang releases: {PYPI_JSON} unreachable ({exc}) and no cache") from exc
                releases = local
    parsed = []
    for text in releases:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if version.is_prerelease and not include_prereleases:
            continue
        if lower is not None and version < Version(lower):
            continue
        if upper is not None and version > Version(upper):
            continue
        parsed.append(version)
    return [str(v) for v in sorted(parsed)]


# ------------------------------------------------------------------ installs and trees


def _version_from_tree(root: Path) -> str | None:
    # Our own cache says it best; newer wheels' version.py only re-exports _version.py
    # (setuptools-scm), which older caches did not unpack.
    manifest = root.parent / "manifest.json"
    if manifest.is_file():
        try:
            return json.loads(manifest.read_text())["version"]
        except (ValueError, KeyError):
            pass
    for name in ("_version.py", "version.py"):
        version_file = root / "sglang" / name
        if version_file.is_file():
            text = version_file.read_text(errors="replace")
            match = re.search(r"(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?[\"']([^\"']+)[\"']", text)
            if match and not match.group(1).startswith("0.0.0"):
                return match.group(1)
    return None


def from_directory(path: str | Path, version: str | None = None) -> SglangSource:
    """A tree that holds sglang's source: a checkout (``python/sglang/srt``), a site-packages
    directory or an unpacked wheel (``sglang/srt``), or the ``sglang`` package directory itself."""
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise SourceError(f"{path}: no such directory")
    candidates = [path, path / "python", path.parent]
    for root in candidates:
        if (root / "sglang" / "srt").is_dir():
            detected = version or _version_from_tree(root) or "unknown"
            return SglangSource(version=detected, root=root, origin="directory")
    raise SourceError(f"{path}: found no sglang/srt tree (looked in {', '.join(str(c) for c in candidates)})")


def from_installed(python: str | None = None) -> SglangSource:
    """The sglang installed for ``python`` (default: this interpreter), found without importing it."""
    interpreter = python or sys.executable
    probe = (
        "import importlib.util, importlib.metadata, json, os\n"
        "spec = importlib.util.find_spec('sglang')\n"
        "loc = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None\n"
        "try:\n    ver = importlib.metadata.version('sglang')\nexcept Exception:\n    ver = None\n"
        "print(json.dumps({'location': loc, 'version': ver}))\n"
    )
    try:
        proc = subprocess.run([interpreter, "-c", probe], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, PermissionError) as exc:
        raise SourceError(f"cannot run {interpreter}: {exc}") from exc
    if proc.returncode != 0:
        raise SourceError(f"{interpreter}: probing for sglang failed: {proc.stderr.strip().splitlines()[-1:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if not info["location"]:
        raise SourceError(f"{interpreter}: sglang is not installed")
    package_dir = Path(info["location"])
    source = from_directory(package_dir.parent, version=info["version"])
    return SglangSource(version=source.version, root=source.root, origin="installed")


def resolve(spec: str | Path) -> SglangSource:
    """Turn a CLI argument into a source: an existing directory, ``installed``, or a release number."""
    text = str(spec)
    if not text.strip():
        # Path("") is the current directory: an empty --sglang must not quietly mean "here".
        _check_version(text)  # raises UsageProblem (exit 2)
    if text == "installed":
        return from_installed()
    if os.path.sep in text or Path(text).is_dir():
        return from_directory(text)
    return fetch(text)
