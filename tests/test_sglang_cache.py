"""The release cache can be trusted: checked on every read, restored or refused when damaged,
shared with no twin's writable inode, clean after a failed fetch, and honest about bad input.

Every test runs on a private cache (``$PD_FORENSICS_CACHE`` under tmp_path), seeded from a
wheel built once per session out of an unpacked release (no download, the shared cache is
only read). ``_download_wheel`` is the one step that talks to PyPI; tests stand in for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from forensics import sglang_source
from forensics.cache import cache_dir
from forensics.exitcodes import EnvironmentProblem, ExitStatus, UsageProblem
from forensics.sglang_source import CacheIntegrityError, SourceError
from tests.cli_helpers import invoke

VERSION = "0.5.15"
NIXL_CONN = "sglang/srt/disaggregation/nixl/conn.py"


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def release_wheel(tmp_path_factory) -> Path:
    """A wheel of sglang 0.5.15's ``sglang/srt`` tree, built from an unpacked copy.

    Read straight from the (shared) cache's folder, never through ``fetch`` (which would
    check, and perhaps restore, the shared cache); downloaded only when it is not there.
    """
    tree = cache_dir() / "sglang" / VERSION / "src"
    if not (tree / NIXL_CONN).is_file():
        tree = sglang_source.fetch(VERSION).root
    wheel = tmp_path_factory.mktemp("wheel") / f"sglang-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(tree.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, str(path.relative_to(tree)))
    return wheel


@pytest.fixture
def downloads() -> list[str]:
    """The releases 'downloaded' by the stand-in for pip download, in order."""
    return []


@pytest.fixture
def private_cache(tmp_path, monkeypatch, release_wheel, downloads) -> Path:
    """An empty private cache whose 'download' copies the session's wheel (counted)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(root))

    def fake_download(version: str, dest: Path) -> Path:
        downloads.append(version)
        if version != VERSION:
            raise SourceError(f"could not fetch sglang {version} with pip download: no such release")
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / release_wheel.name
        target.write_bytes(release_wheel.read_bytes())
        return target

    monkeypatch.setattr(sglang_source, "_download_wheel", fake_download)
    return root


@pytest.fixture
def seeded(private_cache):
    """sglang 0.5.15 fetched into the private cache (wheel kept beside it)."""
    return sglang_source.fetch(VERSION)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(source) -> dict:
    return json.loads((source.root.parent / "manifest.json").read_text())


def _patch_in_place(path: Path, version: str = VERSION) -> str:
    """What the issue's reproduction did: the codemod's fix written over the cached file."""
    from patched_engine.codemod import patch_source

    patched = patch_source(path.read_text(encoding="utf-8"), version).new_text
    path.chmod(0o644)
    path.write_text(patched, encoding="utf-8")
    return patched


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _cli(cache: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PD_FORENSICS_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


# ----------------------------------------------------------------------------- 1. checked on every read


def test_unpack_records_size_mtime_sha_of_every_file_and_makes_them_read_only(seeded, release_wheel):
    manifest = _manifest(seeded)
    assert manifest["version"] == VERSION and manifest["sha256"] == _sha(release_wheel.read_bytes())
    files = manifest["files"]
    on_disk = sorted(str(p.relative_to(seeded.root)) for p in seeded.root.rglob("*") if p.is_file())
    assert sorted(files) == on_disk and NIXL_CONN in files and len(files) > 1000
    for name in (NIXL_CONN, "sglang/srt/disaggregation/common/conn.py", "sglang/version.py"):
        path = seeded.root / name
        size, mtime_ns, digest = files[name]
        st = path.stat()
        assert (st.st_size, st.st_mtime_ns, _sha(path.read_bytes())) == (size, mtime_ns, digest)
    assert all(not p.stat().st_mode & 0o222 for p in seeded.root.rglob("*") if p.is_file())
    kept = seeded.root.parent / manifest["wheel"]  # the wheel is kept: a damaged tree is restored offline
    assert _sha(kept.read_bytes()) == manifest["sha256"] and not kept.stat().st_mode & 0o222


def test_a_cached_conn_py_patched_in_place_is_restored_by_fetch(seeded, downloads):
    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    patched = _patch_in_place(conn)
    assert patched.encode() != original
    assert sglang_source.cached(VERSION) is None  # the stat walk sees it: not trusted as it is
    again = sglang_source.fetch(VERSION, offline=True)  # restored from the kept wheel, no network
    assert conn.read_bytes() == original and not conn.stat().st_mode & 0o222
    assert again.backend_file("nixl") == conn and downloads == [VERSION]  # the first fetch only


def test_a_tamper_that_keeps_size_and_mtime_is_caught_by_the_hash_of_what_is_read(seeded):
    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    st = conn.stat()
    forged = original.replace(b"Foreign traffic?", b"Foreign trafficX")
    assert forged != original and len(forged) == len(original)
    conn.chmod(0o644)
    conn.write_bytes(forged)
    conn.chmod(0o444)
    os.utime(conn, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sglang_source.cached(VERSION) is not None  # size and mtime match: only a hash can tell
    assert seeded.verified_read_bytes(NIXL_CONN) == original  # restored, then read
    assert conn.read_bytes() == original
    conn.chmod(0o644)
    conn.write_bytes(forged)
    os.utime(conn, ns=(st.st_atime_ns, st.st_mtime_ns))
    seeded.backend_file("nixl")  # the path handed to readers is checked too
    assert conn.read_bytes() == original


def test_a_damaged_file_that_cannot_be_restored_is_exit_4_naming_it(seeded, private_cache, monkeypatch):
    conn = seeded.root / NIXL_CONN
    wheel = seeded.root.parent / _manifest(seeded)["wheel"]
    wheel.unlink()  # no kept wheel, and offline: nothing to restore from
    _patch_in_place(conn)
    with pytest.raises(CacheIntegrityError) as caught:
        sglang_source.fetch(VERSION, offline=True)
    assert caught.value.exit_status == ExitStatus.ENVIRONMENT and caught.value.path == str(conn)
    assert str(conn) in str(caught.value) and "offline" in str(caught.value)

    def unreachable(version, dest):
        raise SourceError("could not fetch sglang 0.5.15 with pip download: network is unreachable")

    monkeypatch.setattr(sglang_source, "_download_wheel", unreachable)
    for read in (lambda: sglang_source.fetch(VERSION), lambda: seeded.verified_read_bytes(NIXL_CONN)):
        with pytest.raises(CacheIntegrityError, match="network is unreachable") as caught:
            read()
        assert caught.value.path == str(conn)
    # A wheel that is not the recorded one is never used to restore the tree.
    monkeypatch.setattr(sglang_source, "_download_wheel", _other_wheel)
    with pytest.raises(CacheIntegrityError, match="not the .* recorded"):
        sglang_source.fetch(VERSION)


def test_patch_verify_stops_with_exit_4_on_a_release_it_cannot_trust(seeded, monkeypatch):
    from patched_engine.verify import verify_release

    (seeded.root.parent / _manifest(seeded)["wheel"]).unlink()
    _patch_in_place(seeded.root / NIXL_CONN)

    def unreachable(version, dest):
        raise SourceError("could not fetch sglang 0.5.15 with pip download: network is unreachable")

    monkeypatch.setattr(sglang_source, "_download_wheel", unreachable)
    with pytest.raises(CacheIntegrityError) as caught:  # never an INCONCLUSIVE verdict on a doctored file
        verify_release(VERSION, nixl=False)
    assert caught.value.path == str(seeded.root / NIXL_CONN)


def _other_wheel(version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("sglang/srt/disaggregation/nixl/conn.py", "GUARD = b'x'\n")
    return wheel


def test_concurrent_readers_of_a_damaged_release_restore_it_once_and_all_get_the_real_file(seeded):
    from concurrent.futures import ThreadPoolExecutor

    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    _patch_in_place(conn)
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(sglang_source.fetch, VERSION, offline=True) for _ in range(3)]
        futures += [pool.submit(seeded.verified_read_bytes, NIXL_CONN) for _ in range(3)]
        results = [f.result(timeout=120) for f in futures]
    assert all(r == original for r in results[3:]) and conn.read_bytes() == original
    assert sorted(p.name for p in seeded.root.parent.parent.iterdir()) == [VERSION]  # no lock or temp left


def test_files_added_or_removed_after_unpack_are_put_right(seeded):
    extra = seeded.root / "sglang/srt/disaggregation/common/injected.py"  # the handler map globs common/*.py
    extra.write_text("ABORT = b'nope'\n")
    gone = seeded.root / "sglang/srt/disaggregation/mooncake/conn.py"
    gone.unlink()
    assert sglang_source.cached(VERSION) is None
    sglang_source.fetch(VERSION, offline=True)
    assert not extra.exists() and gone.is_file()


def test_an_older_cache_entry_without_file_records_is_rebuilt_from_the_same_wheel(private_cache, release_wheel,
                                                                                   downloads):
    # What the cache held before this check existed: src/ and a manifest with the wheel's sha256 only.
    release = private_cache / "sglang" / VERSION
    (release / "src").mkdir(parents=True)
    with zipfile.ZipFile(release_wheel) as archive:
        archive.extractall(release / "src")
    (release / "src" / NIXL_CONN).write_text("# edited\n")
    (release / "manifest.json").write_text(json.dumps({
        "version": VERSION, "wheel": release_wheel.name, "sha256": _sha(release_wheel.read_bytes()),
        "unpacked": "sglang/srt"}))
    source = sglang_source.fetch(VERSION)
    assert downloads == [VERSION]  # downloaded again, its sha256 checked against the record
    assert NIXL_CONN in _manifest(source)["files"]
    with zipfile.ZipFile(release_wheel) as archive:
        assert (source.root / NIXL_CONN).read_bytes() == archive.read(NIXL_CONN)


@pytest.mark.server
@pytest.mark.timeout(400)
def test_patch_verify_and_handlers_check_see_the_real_release_after_an_in_place_patch(seeded, private_cache):
    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    _patch_in_place(conn)
    proc = _cli(private_cache, "handlers", "check", "--source", VERSION, "--json")
    document = json.loads(proc.stdout)
    assert proc.returncode == 1 and document["exit"] == 1, proc.stdout + proc.stderr
    assert any(f["backend"] == "nixl" and f["tag"] == "ABORT" and f["severity"] == "critical"
               for f in document["findings"])
    assert conn.read_bytes() == original

    _patch_in_place(conn)
    proc = _cli(private_cache, "patch", "verify", "--sglang", VERSION, "--json")
    document = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert document["vulnerable"] is True and document["runs"]["unpatched"]["died_at"] == "ABORT room 2"
    assert conn.read_bytes() == original


def test_the_handler_map_and_sandbox_read_through_the_check(seeded):
    from forensics.handlers.handler_map import build

    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    st = conn.stat()
    forged = original.replace(b"Foreign traffic?", b"Foreign trafficX")
    conn.chmod(0o644)
    conn.write_bytes(forged)
    os.utime(conn, ns=(st.st_atime_ns, st.st_mtime_ns))  # invisible to the stat walk
    handler_map = build(seeded)
    assert conn.read_bytes() == original
    assert any(f.backend == "nixl" and f.tag == "ABORT" for f in handler_map.findings)
    assert "Foreign traffic?" in next(f for f in handler_map.findings if f.backend == "nixl").summary


def test_the_sandbox_import_finder_checks_what_it_loads(seeded):
    """The shim's finder hashes each cached module before the import system reads it."""
    import forensics.sandbox.shim as shim

    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    conn.chmod(0o644)
    conn.write_bytes(original + b"\n# tampered\n")
    release = shim.LoadedRelease(version=VERSION, root=seeded.root, nixl_conn=None, nixl="unavailable")
    finder = shim.ReleaseFinder(release)
    spec = finder.find_spec("sglang.srt.disaggregation.nixl.conn", [str(seeded.root / "sglang/srt/disaggregation/nixl")])
    assert spec is not None and Path(spec.origin) == conn
    assert conn.read_bytes() == original


# ----------------------------------------------------------------------------- 2. twins share no writable inode


def test_a_twin_copy_shares_no_writable_inode_with_the_cache(seeded, tmp_path):
    from forensics.twin.api import copy_release

    site = copy_release(seeded.root, tmp_path / "twin" / "site-packages")
    cache_inodes = {p.stat().st_ino: p for p in seeded.root.rglob("*") if p.is_file()}
    shared = [p for p in (site / "sglang").rglob("*") if p.is_file() and p.stat().st_ino in cache_inodes]
    for path in shared:  # only read-only data files, never Python or disaggregation/
        assert not path.stat().st_mode & 0o222 and path.suffix != ".py" and "disaggregation" not in path.parts
    copies = {str(p.relative_to(site)) for p in (site / "sglang").rglob("*.py")}
    assert NIXL_CONN in copies and "sglang/srt/environ.py" in copies

    before = {name: (seeded.root / name).read_bytes() for name in (NIXL_CONN, "sglang/srt/environ.py")}
    inodes = {name: (seeded.root / name).stat().st_ino for name in before}
    for name in before:
        twin_file = site / name
        assert twin_file.stat().st_ino != inodes[name] and twin_file.stat().st_mode & stat.S_IWUSR
        twin_file.write_text("# the twin's own edit\n")  # what a patch deploy or a debugging user does
    for name, data in before.items():
        assert (seeded.root / name).read_bytes() == data and (seeded.root / name).stat().st_ino == inodes[name]
    assert sglang_source.cached(VERSION) is not None  # the cache is untouched: no mismatch at all


def test_a_twin_copy_leaves_the_caches_bytecode_behind(seeded, tmp_path):
    from forensics.twin.api import copy_release

    # What a Python that writes bytecode leaves in the cache when the sandbox imports from it.
    pycache = seeded.root / "sglang" / "srt" / "disaggregation" / "__pycache__"
    pycache.mkdir()
    (pycache / "utils.cpython-311.pyc").write_bytes(b"\x00" * 16)
    site = copy_release(seeded.root, tmp_path / "twin" / "site-packages")
    assert not list((site / "sglang").rglob("__pycache__"))
    assert (site / NIXL_CONN).is_file()


def test_a_twin_copy_of_a_tampered_cache_gets_the_real_release(seeded, tmp_path):
    from forensics.twin.api import copy_release

    conn = seeded.root / NIXL_CONN
    original = conn.read_bytes()
    st = conn.stat()
    conn.chmod(0o644)
    conn.write_bytes(original.replace(b"Foreign traffic?", b"Foreign trafficX"))
    os.utime(conn, ns=(st.st_atime_ns, st.st_mtime_ns))
    site = copy_release(seeded.root, tmp_path / "site-packages")
    assert (site / NIXL_CONN).read_bytes() == original == conn.read_bytes()


# ----------------------------------------------------------------------------- 3. a failed fetch leaves nothing


@pytest.mark.timeout(300)
def test_a_release_that_does_not_exist_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "sglang"
    folder.mkdir(parents=True)
    with pytest.raises(SourceError, match="0.5.99") as caught:
        sglang_source.fetch("0.5.99")  # the real pip download, which finds no such release
    assert caught.value.exit_status == ExitStatus.ENVIRONMENT
    assert _listing(folder) == []


def test_a_failed_fetch_also_clears_what_older_failed_fetches_left(private_cache):
    folder = private_cache / "sglang"
    (folder / "0.5.98").mkdir(parents=True)  # today's leftovers: an empty release folder, a lock file
    (folder / ".0.5.98.lock").write_text("")
    with pytest.raises(SourceError, match="0.5.98"):
        sglang_source.fetch("0.5.98")
    assert _listing(folder) == []


@pytest.mark.parametrize("failure", [SourceError("pip download died"), OSError(28, "No space left on device"),
                                     KeyboardInterrupt()])
def test_a_download_that_fails_midway_leaves_nothing_behind(private_cache, monkeypatch, failure):
    def half_download(version: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / f"sglang-{version}-py3-none-any.whl").write_bytes(b"PK\x03\x04 half a wheel")
        raise failure

    monkeypatch.setattr(sglang_source, "_download_wheel", half_download)
    with pytest.raises(type(failure)):
        sglang_source.fetch(VERSION)
    assert _listing(private_cache / "sglang") == []


def test_a_corrupt_wheel_leaves_nothing_and_a_killed_fetchs_leftovers_are_cleaned(private_cache, monkeypatch):
    download = sglang_source._download_wheel

    def bad_wheel(version: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / f"sglang-{version}-py3-none-any.whl"
        wheel.write_bytes(b"not a zip at all")
        return wheel

    monkeypatch.setattr(sglang_source, "_download_wheel", bad_wheel)
    with pytest.raises(SourceError, match="not a valid wheel"):
        sglang_source.fetch(VERSION)
    assert _listing(private_cache / "sglang") == []
    # A fetch killed midway (SIGKILL: no cleanup ran) leaves its staging folder; the next fetch
    # of that release removes it under the release's lock.
    leftover = private_cache / "sglang" / f".tmp-{VERSION}-killed"
    (leftover / "release" / "src").mkdir(parents=True)
    monkeypatch.setattr(sglang_source, "_download_wheel", download)
    sglang_source.fetch(VERSION)
    assert sorted(p.name for p in (private_cache / "sglang").iterdir()) == [VERSION]


# ----------------------------------------------------------------------------- 4. a corrupt manifest is exit 4


# Two shapes in the fast lane (not JSON; JSON of the wrong shape), every shape in CI.
@pytest.mark.parametrize("content", [
    b"{not json",
    pytest.param(b"\xff\xfe not utf-8", marks=pytest.mark.thorough),
    pytest.param(b"[]", marks=pytest.mark.thorough),
    json.dumps({"version": VERSION, "wheel": "w.whl", "sha256": 12}).encode(),
    pytest.param(json.dumps({"version": VERSION, "wheel": "sglang-0.5.15-py3-none-any.whl", "sha256": "0" * 64,
                             "files": ["sglang/srt/x.py"]}).encode(), marks=pytest.mark.thorough),
    pytest.param(json.dumps({"version": VERSION, "wheel": "sglang-0.5.15-py3-none-any.whl", "sha256": "0" * 64,
                             "files": {"sglang/srt/x.py": ["1", 2, "ab"]}}).encode(), marks=pytest.mark.thorough),
], ids=["not-json", "not-utf-8", "a-list", "sha256-a-number", "files-a-list", "file-record-wrong"])
def test_a_corrupt_manifest_is_an_environment_problem_naming_it(seeded, content):
    manifest = seeded.root.parent / "manifest.json"
    manifest.chmod(0o644)
    manifest.write_bytes(content)
    for call in (lambda: sglang_source.fetch(VERSION), lambda: sglang_source.cached(VERSION),
                 lambda: seeded.verified_read_bytes(NIXL_CONN)):
        with pytest.raises(CacheIntegrityError, match="manifest is corrupt") as caught:
            call()
        assert caught.value.exit_status == ExitStatus.ENVIRONMENT and caught.value.path == str(manifest)
        assert str(manifest) in str(caught.value)


def test_a_corrupt_manifest_through_the_cli_is_exit_4_with_its_path(seeded):
    manifest = seeded.root.parent / "manifest.json"
    manifest.chmod(0o644)
    manifest.write_text('{"version": "0.5.15", "wheel": ')
    status, out, err = invoke("handlers", "check", "--source", VERSION, "--json")
    document = json.loads(out)
    assert status == 4 and document["exit"] == 4 and document["kind"] == "CacheIntegrityError"
    assert str(manifest) in document["error"] and str(manifest) in err
    assert "Traceback" not in err


# ----------------------------------------------------------------------------- 5. an empty release is a usage error


def test_an_empty_release_is_a_usage_error_not_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "sglang" / "srt" / "disaggregation").mkdir(parents=True)  # a tree "." would find
    monkeypatch.chdir(tmp_path)
    for spec in ("", "  "):
        with pytest.raises(UsageProblem, match="empty"):
            sglang_source.resolve(spec)
        with pytest.raises(UsageProblem):
            sglang_source.fetch(spec)
    assert not issubclass(UsageProblem, EnvironmentProblem)


@pytest.mark.parametrize("args", [
    ("patch", "diff", "--sglang", ""),
    ("patch", "verify", "--sglang", ""),
    ("handlers", "diff", "--sglang", ""),
    ("handlers", "check", "--source", ""),
    ("twin", "up", "--sglang", ""),
])
def test_every_release_option_rejects_an_empty_value_with_exit_2(args, tmp_path, monkeypatch):
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "sglang" / "srt" / "disaggregation" / "nixl").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    status, out, err = invoke(*args, "--json")
    document = json.loads(out)
    assert status == 2 and document["exit"] == 2, (args, out, err)
    assert "empty" in document["error"]
    assert list((tmp_path / "cache").glob("sglang/*")) == []
