"""The source of one sglang release, from a cached PyPI wheel, an install or a checkout.

sglang is never a dependency of PD Forensics (its wheel declares torch). We read,
run and patch its disaggregation code from one of three places:

* a wheel fetched with ``pip download --no-deps sglang==X`` into the cache, its
  sha256 kept, only ``sglang/srt/`` unpacked (``fetch``);
* the sglang installed in an interpreter (``from_installed``);
* a directory: a git checkout or any tree holding ``sglang/srt`` (``from_directory``).

Every path returns one :class:`SglangSource`, which knows where each backend's
files are.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from forensics.cache import cache_dir
from forensics.exitcodes import EnvironmentProblem

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
        return path

    def shared_file(self, which: str) -> Path:
        """``common`` or ``base`` conn.py (``common`` exists from 0.5.9; raises when absent)."""
        path = self.root / SHARED_FILES[which]
        if not path.is_file():
            raise SourceError(f"sglang {self.version} ({self.origin} at {self.root}) has no {SHARED_FILES[which]}")
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
        path = self.root / relative
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise SourceError(f"sglang {self.version}: {path} does not exist") from exc


# --------------------------------------------------------------------------- wheels


def _wheel_cache() -> Path:
    path = cache_dir() / "sglang"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise fetches of one release across processes (parallel tests share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_version(version: str) -> str:
    try:
        Version(version)
    except InvalidVersion as exc:
        raise SourceError(f"{version!r} is not a valid sglang release number") from exc
    if not re.fullmatch(r"[0-9A-Za-z.+-]+", version):
        raise SourceError(f"{version!r} is not a valid sglang release number")
    return version


def cached(version: str) -> SglangSource | None:
    """The cached source of ``version`` if it is already unpacked, else None (no network)."""
    release_dir = _wheel_cache() / _check_version(version)
    manifest = release_dir / "manifest.json"
    if not manifest.is_file():
        return None
    meta = json.loads(manifest.read_text())
    return SglangSource(
        version=version,
        root=release_dir / "src",
        origin="wheel",
        sha256=meta["sha256"],
        wheel_name=meta["wheel"],
    )


def fetch(version: str, *, offline: bool = False) -> SglangSource:
    """The source of sglang ``version`` from its PyPI wheel, downloaded once into the cache.

    Only ``sglang/srt/`` is unpacked; the wheel and its sha256 are kept beside it.
    Raises :class:`SourceError` naming the release when it cannot be fetched.
    """
    version = _check_version(version)
    hit = cached(version)
    if hit is not None:
        return hit
    release_dir = _wheel_cache() / version
    with _locked(_wheel_cache() / f".{version}.lock"):
        hit = cached(version)
        if hit is not None:
            return hit
        if offline:
            raise SourceError(f"sglang {version} is not in the cache ({release_dir}) and offline mode is on")
        release_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=release_dir) as tmp:
            command = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "--quiet", "--dest", tmp, f"sglang=={version}",
            ]
            proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
            wheels = list(Path(tmp).glob("sglang-*.whl"))
            if proc.returncode != 0 or not wheels:
                reason = (proc.stderr or proc.stdout).strip().splitlines()
                raise SourceError(
                    f"could not fetch sglang {version} with pip download: "
                    f"{reason[-1] if reason else f'exit status {proc.returncode}'}"
                )
            wheel_tmp = wheels[0]
            digest = _sha256(wheel_tmp)
            src_tmp = Path(tmp) / "src"
            _unpack_srt(wheel_tmp, src_tmp)
            # The wheel itself is dropped (tens of MB each); its name and sha256 stay in the manifest.
            if (release_dir / "src").exists():
                shutil.rmtree(release_dir / "src")
            os.replace(src_tmp, release_dir / "src")
            manifest = {"version": version, "wheel": wheel_tmp.name, "sha256": digest, "unpacked": "sglang/srt"}
            tmp_manifest = release_dir / "manifest.json.tmp"
            tmp_manifest.write_text(json.dumps(manifest, indent=2))
            os.replace(tmp_manifest, release_dir / "manifest.json")
    result = cached(version)
    assert result is not None
    return result


def _unpack_srt(wheel: Path, dest: Path) -> None:
    """Extract ``sglang/srt/**`` (and the package's ``version.py``) from a wheel, nothing else."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                name = member.filename
                if not (name.startswith("sglang/srt/") or name in ("sglang/version.py", "sglang/_version.py")):
                    continue
                target = (dest / name).resolve()
                if not str(target).startswith(str(dest.resolve())):
                    raise SourceError(f"{wheel.name}: refusing path outside the tree: {name}")
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
    except zipfile.BadZipFile as exc:
        raise SourceError(f"{wheel}: not a valid wheel ({exc})") from exc
    if not (dest / "sglang" / "srt").is_dir():
        raise SourceError(f"{wheel.name}: has no sglang/srt/ tree")


def available_releases(
    lower: str | None = None, upper: str | None = None, *, include_prereleases: bool = False
) -> list[str]:
    """sglang releases on PyPI (cached for a day), oldest first, optionally within [lower, upper]."""
    index_file = _wheel_cache() / "pypi-releases.json"
    releases: list[str] | None = None
    import time

    if index_file.is_file() and time.time() - index_file.stat().st_mtime < 86400:
        releases = json.loads(index_file.read_text())
    if releases is None:
        try:
            with urllib.request.urlopen(PYPI_JSON, timeout=30) as response:
                data = json.load(response)
            releases = [v for v, files in data["releases"].items() if any(f.get("packagetype") == "bdist_wheel" for f in files)]
            index_file.write_text(json.dumps(releases))
        except Exception as exc:  # network refused, DNS, bad JSON: fall back to what is cached
            if index_file.is_file():
                releases = json.loads(index_file.read_text())
            else:
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
    if text == "installed":
        return from_installed()
    if os.path.sep in text or Path(text).is_dir():
        return from_directory(text)
    return fetch(text)
