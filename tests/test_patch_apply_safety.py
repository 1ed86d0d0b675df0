"""``patch apply`` on a real installation: owner, symlinks, line endings, encodings, a full or
read-only disk, an immutable directory, and a kill at every step (the real CLI, SIGKILLed by
the fault-injection hook ``PD_FORENSICS_APPLY_KILL_AT``)."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_document, run_forensics

from forensics.exitcodes import EnvironmentProblem
from forensics.sglang_source import fetch
from patched_engine import snippets
from patched_engine.apply import (
    KILL_ENV,
    KILL_POINTS,
    apply_file,
    plan_apply,
    record_path_for,
    restore_backup,
    verify_backup,
)

pytestmark = pytest.mark.timeout(300)

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def original_bytes() -> bytes:
    return fetch("0.5.15").backend_file("nixl").read_bytes()


@pytest.fixture(scope="module")
def patched_bytes(original_bytes, tmp_path_factory) -> bytes:
    scratch = tmp_path_factory.mktemp("plan") / "conn.py"
    scratch.write_bytes(original_bytes)
    return plan_apply(scratch).new_bytes


def forensics(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``forensics patch ARGS`` in a child process, without an inherited kill point."""
    return run_forensics("patch", *args, env=env, timeout=timeout, drop_env=(KILL_ENV,))


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def backups_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".pd-forensics-backup-" in p.name and not p.name.startswith("."))


def changed_lines(diff_lines) -> list[str]:
    """The -/+ lines of a unified diff, line endings dropped."""
    return [line.rstrip("\r\n") for line in diff_lines
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


# ----------------------------------------------------------------------------- owner, mode, symlink


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to uid 1234 needs root")
def test_owner_group_and_mode_are_kept(tmp_path, original_bytes) -> None:
    conn = tmp_path / "conn.py"
    conn.write_bytes(original_bytes)
    os.chown(conn, 1234, 1234)
    conn.chmod(0o640)
    plan = plan_apply(conn)
    assert any("owner 1234:1234 and mode 0640" in action for action in plan.actions())
    result = apply_file(conn, yes=True)
    assert result.status == "applied"
    info = conn.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1234, 1234, 0o640)
    assert snippets.SENTINEL_NAME.encode() in conn.read_bytes()
    # The backup and its record keep the owner and are readable by it only (0600, issue 19).
    for kept in (result.backup, result.record):
        backup = kept.stat()
        assert (backup.st_uid, backup.st_gid, stat.S_IMODE(backup.st_mode)) == (1234, 1234, 0o600), kept
    # A rollback keeps the file's owner and mode; with the file gone, the record's mode (not the backup's).
    restore_backup(conn, result.backup)
    info = conn.stat()
    assert conn.read_bytes() == original_bytes
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1234, 1234, 0o640)
    conn.unlink()
    restore_backup(conn, result.backup)
    info = conn.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1234, 1234, 0o640)


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to uid 1234 needs root")
def test_an_owner_that_cannot_be_kept_is_refused_and_nothing_changes(tmp_path, original_bytes, monkeypatch) -> None:
    # As a user who is not root and not the file's owner: chown is refused, so is the patch.
    conn = tmp_path / "conn.py"
    conn.write_bytes(original_bytes)
    os.chown(conn, 1234, 1234)

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", refuse)
    with pytest.raises(EnvironmentProblem, match="cannot keep its owner 1234:1234") as caught:
        apply_file(conn, yes=True)
    assert caught.value.path == str(tmp_path) and "nothing changed" in str(caught.value)
    assert names(tmp_path) == ["conn.py"] and conn.read_bytes() == original_bytes
    assert (conn.stat().st_uid, conn.stat().st_gid) == (1234, 1234)


def test_a_symlinked_conn_py_has_its_target_patched_and_the_link_kept(tmp_path, original_bytes) -> None:
    from rich.console import Console

    vendored = tmp_path / "vendor" / "sglang-nixl" / "conn.py"
    vendored.parent.mkdir(parents=True)
    vendored.write_bytes(original_bytes)
    link = tmp_path / "site-packages" / "sglang" / "srt" / "disaggregation" / "nixl" / "conn.py"
    link.parent.mkdir(parents=True)
    link.symlink_to(vendored)

    planned = apply_file(link)
    sentence = f"{link} is a symlink to {vendored}; the target is patched, the link kept"
    assert planned.status == "planned" and sentence in planned.plan.actions()
    assert planned.plan.to_dict()["symlink"] is True and planned.plan.to_dict()["target"] == str(vendored)
    console = Console(record=True, width=400)
    console.print(planned)
    assert sentence in console.export_text()
    assert link.is_symlink() and vendored.read_bytes() == original_bytes

    result = apply_file(link, yes=True)
    assert result.status == "applied"
    assert link.is_symlink() and os.readlink(link) == str(vendored)
    assert snippets.SENTINEL_NAME.encode() in vendored.read_bytes()
    assert result.backup.parent == vendored.parent and result.backup.read_bytes() == original_bytes
    assert names(link.parent) == ["conn.py"]  # nothing written beside the link

    assert apply_file(link, yes=True).status == "already-patched"
    restore_backup(link, result.backup)
    assert link.is_symlink() and vendored.read_bytes() == original_bytes


# ----------------------------------------------------------------------------- line endings and encodings


def _crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def _mixed(data: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    return b"".join(line.replace(b"\n", b"\r\n") if i % 3 == 0 else line for i, line in enumerate(lines))


@pytest.mark.parametrize("shape", ["crlf", pytest.param("crlf-no-final-newline", marks=pytest.mark.thorough),
                                   "lf-no-final-newline", "mixed"])
def test_line_endings_are_kept_and_only_the_patch_lines_change(tmp_path, original_bytes, shape) -> None:
    before = {
        "crlf": _crlf(original_bytes),
        "crlf-no-final-newline": _crlf(original_bytes).rstrip(b"\r\n"),
        "lf-no-final-newline": original_bytes.rstrip(b"\n"),
        "mixed": _mixed(original_bytes),
    }[shape]
    conn = tmp_path / "conn.py"
    conn.write_bytes(before)
    result = apply_file(conn, yes=True)
    assert result.status == "applied"
    after = conn.read_bytes()
    assert result.backup.read_bytes() == before

    # The review diff is the codemod's, with no carriage returns in it.
    assert "\r" not in result.plan.patch.diff
    # The file's own diff (endings kept) changes exactly the lines the review diff shows, nothing else.
    real = difflib.unified_diff(before.decode().splitlines(keepends=True), after.decode().splitlines(keepends=True))
    assert changed_lines(real) == changed_lines(result.plan.patch.diff.splitlines(keepends=True))
    assert after.endswith(b"\n") == before.endswith(b"\n")
    if shape.startswith("crlf"):
        assert after.count(b"\n") == after.count(b"\r\n") > before.count(b"\r\n")
    # (A line whose ending changed would show in the file's diff as a -/+ pair: untouched lines keep theirs.)
    compile(after, str(conn), "exec")


def test_a_utf8_bom_survives(tmp_path, original_bytes, patched_bytes) -> None:
    conn = tmp_path / "conn.py"
    conn.write_bytes(b"\xef\xbb\xbf" + original_bytes)
    result = apply_file(conn, yes=True)
    assert result.status == "applied" and result.plan.form.bom
    assert conn.read_bytes() == b"\xef\xbb\xbf" + patched_bytes


def test_a_latin1_coding_cookie_survives(tmp_path, original_bytes) -> None:
    cookie = b"# -*- coding: latin-1 -*-\n"
    before = cookie + original_bytes + "# Maintainer: Fran\u00e7ois M\u00fcller, caf\u00e9\n".encode("latin-1")
    conn = tmp_path / "conn.py"
    conn.write_bytes(before)
    plan = plan_apply(conn)
    assert plan.form.encoding == "iso-8859-1"
    result = apply_file(conn, yes=True)
    after = conn.read_bytes()
    assert after.startswith(cookie) and after.endswith(b"Fran\xe7ois M\xfcller, caf\xe9\n")
    real = difflib.unified_diff(before.decode("latin-1").splitlines(keepends=True),
                                after.decode("latin-1").splitlines(keepends=True))
    assert changed_lines(real) == changed_lines(result.plan.patch.diff.splitlines(keepends=True))
    compile(after, str(conn), "exec")


# ----------------------------------------------------------------------------- stale files, the hook


def test_stale_temporary_files_of_dead_runs_are_named_then_removed(tmp_path, original_bytes) -> None:
    conn = tmp_path / "conn.py"
    conn.write_bytes(original_bytes)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, timeout=120, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".conn.py.pd-forensics-{dead_pid}.tmp"
    stale.write_bytes(original_bytes[:5000])  # a half-written temp of a killed run
    stale_backup = tmp_path / f".conn.py.pd-forensics-backup-20260101T000000000000Z.pd-forensics-{dead_pid}.tmp"
    stale_backup.write_bytes(original_bytes[:4096])
    alive = tmp_path / ".conn.py.pd-forensics-1.tmp"  # pid 1 is running: not ours to remove
    alive.write_bytes(b"")
    other = tmp_path / f".other.py.pd-forensics-{dead_pid}.tmp"  # another file's: left alone
    other.write_bytes(b"")

    plan = apply_file(conn)
    assert {s.path for s in plan.plan.stale} == {stale, stale_backup}
    assert any(f"remove {stale}, a stale temporary file (left by pid {dead_pid}" in a for a in plan.plan.actions())
    assert stale.exists() and stale_backup.exists()  # a plan removes nothing

    result = apply_file(conn, yes=True)
    assert set(result.removed_stale) == {stale, stale_backup}
    assert not stale.exists() and not stale_backup.exists() and alive.exists() and other.exists()


def test_an_unknown_kill_point_is_refused_before_anything_is_written(tmp_path, original_bytes, monkeypatch) -> None:
    conn = tmp_path / "conn.py"
    conn.write_bytes(original_bytes)
    monkeypatch.setenv(KILL_ENV, "after-lunch")
    with pytest.raises(EnvironmentProblem, match="not a kill point"):
        apply_file(conn, yes=True)
    assert names(tmp_path) == ["conn.py"] and conn.read_bytes() == original_bytes


# The fast lane kills at one step (the rename, where a half-done apply would show); CI kills at each.
@pytest.mark.parametrize("point", [point if point == "before-rename" else pytest.param(point, marks=pytest.mark.thorough)
                                   for point in KILL_POINTS])
def test_a_kill_at_any_step_leaves_a_whole_file_and_a_verified_backup(tmp_path, original_bytes, patched_bytes,
                                                                     point) -> None:
    conn = tmp_path / "conn.py"
    conn.write_bytes(original_bytes)
    conn.chmod(0o640)

    killed = forensics("apply", "--file", str(conn), "--yes", env={KILL_ENV: point})
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    expected = patched_bytes if point == "after-rename" else original_bytes
    assert conn.read_bytes() == expected
    backups = backups_in(tmp_path)
    assert len(backups) == (0 if point == "after-backup-temp-write" else 1)
    for backup in backups:  # whatever backup exists is whole and matches its recorded sha256
        assert backup.read_bytes() == original_bytes
        verify_backup(backup)
        assert json.loads(record_path_for(backup).read_text())["sha256"] == verify_backup(backup)
    # Left for the next run: temporary files, and the record of a backup never finished.
    orphans = [p.name for p in tmp_path.iterdir() if ".pd-forensics-record-" in p.name
               and not (tmp_path / json.loads(p.read_text())["backup"]).exists()]
    leftovers = sorted([name for name in names(tmp_path) if name.startswith(".")] + orphans)
    assert bool(orphans) == (point == "after-backup-temp-write")
    if point in ("after-backup-temp-write", "after-temp-write", "before-rename"):
        assert leftovers, "the kill should have left a temporary file for the next run to clean"

    if leftovers:  # a plan names them and removes nothing
        plan = forensics("apply", "--file", str(conn), "--json")
        assert plan.returncode == 0, plan.stderr
        assert sorted(Path(p).name for p in one_document(plan.stdout)["stale"]) == leftovers
        assert names(tmp_path) == sorted(["conn.py", *leftovers, *(p.name for p in backups),
                                          *(record_path_for(p).name for p in backups)])

    again = forensics("apply", "--file", str(conn), "--yes", "--json")
    assert again.returncode == 0, again.stderr
    document = one_document(again.stdout)
    assert document["status"] == ("already-patched" if point == "after-rename" else "applied")
    assert sorted(Path(p).name for p in document["removed_stale"]) == leftovers
    assert conn.read_bytes() == patched_bytes and stat.S_IMODE(conn.stat().st_mode) == 0o640
    assert not [name for name in names(tmp_path) if name.startswith(".")]
    backups = backups_in(tmp_path)
    assert backups
    records = sorted(p for p in tmp_path.iterdir() if ".pd-forensics-record-" in p.name)
    assert records == sorted(record_path_for(b) for b in backups)  # no orphan record either
    for backup in backups:
        assert backup.read_bytes() == original_bytes
        verify_backup(backup)


# ----------------------------------------------------------------------------- full, read-only, immutable


@contextlib.contextmanager
def tmpfs(where: Path, size_bytes: int):
    where.mkdir(parents=True, exist_ok=True)
    if not IS_ROOT or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(where)],
                             capture_output=True, text=True, timeout=60)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, timeout=60).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)


def _pages(n: int) -> int:
    return -(-n // 4096)


def _assert_exit_4_and_nothing_changed(proc, directory: Path, original_bytes: bytes, named: Path) -> None:
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(named) in lines[0], proc.stderr
    assert (directory / "conn.py").read_bytes() == original_bytes
    assert names(directory) == ["conn.py"]  # no temp file, no partial backup, no record


@pytest.mark.parametrize("fails_at", ["backup", "patched-file"])
def test_a_full_disk_is_exit_4_and_leaves_nothing(tmp_path, original_bytes, patched_bytes, fails_at) -> None:
    size = _pages(len(original_bytes))
    if fails_at == "backup":
        pages = size + size // 2  # the original fits, its copy does not
    else:
        pages = 2 * size + 1 + _pages(len(patched_bytes)) // 2  # original, backup, record; not the new file
    with tmpfs(tmp_path / "disk", pages * 4096) as disk:
        conn = disk / "conn.py"
        conn.write_bytes(original_bytes)
        proc = forensics("apply", "--file", str(conn), "--yes")
        named = disk if fails_at == "patched-file" else None
        if named is None:
            named = Path(one_line_path(proc.stderr, "cannot write "))
            assert named.parent == disk and named.name.startswith("conn.py.pd-forensics-backup-")
        assert "No space left on device" in proc.stderr
        _assert_exit_4_and_nothing_changed(proc, disk, original_bytes, named)


def one_line_path(stderr: str, after: str) -> str:
    return stderr.split(after, 1)[1].split(":", 1)[0]


def test_a_read_only_file_system_is_exit_4_and_leaves_nothing(tmp_path, original_bytes) -> None:
    with tmpfs(tmp_path / "ro", 1 << 20) as disk:
        conn = disk / "conn.py"
        conn.write_bytes(original_bytes)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, capture_output=True, timeout=60)
        proc = forensics("apply", "--file", str(conn), "--yes", "--json")
        assert "Read-only file system" in proc.stderr
        document = one_document(proc.stdout)
        assert document["exit"] == 4 and str(disk) in document["error"]
        _assert_exit_4_and_nothing_changed(proc, disk, original_bytes, disk)

        # With the backup elsewhere, the backup is made, the write fails, and the backup goes again.
        elsewhere = tmp_path / "backups"
        proc = forensics("apply", "--file", str(conn), "--yes", "--backup-dir", str(elsewhere))
        _assert_exit_4_and_nothing_changed(proc, disk, original_bytes, disk)
        assert names(elsewhere) == []


@contextlib.contextmanager
def immutable(path: Path):
    """``chattr +i`` on ``path``, or a read-only bind mount where chattr cannot be had; undone after."""
    if not IS_ROOT:
        pytest.skip("making a directory immutable needs root")
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(path)], capture_output=True,
                                                 timeout=60).returncode == 0:
        try:
            yield "Operation not permitted"
        finally:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True, timeout=60)
        return
    if not path.is_dir():
        pytest.skip("chattr +i is not available here")
    bound = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True, timeout=60)
    if bound.returncode != 0:
        pytest.skip(f"neither chattr +i nor a bind mount is available: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True, capture_output=True, timeout=60)
        yield "Read-only file system"
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)


def test_an_immutable_directory_is_exit_4_and_leaves_nothing(tmp_path, original_bytes) -> None:
    directory = tmp_path / "nixl"
    directory.mkdir()
    conn = directory / "conn.py"
    conn.write_bytes(original_bytes)
    with immutable(directory) as reason:
        proc = forensics("apply", "--file", str(conn), "--yes")
        assert reason in proc.stderr
        _assert_exit_4_and_nothing_changed(proc, directory, original_bytes, directory)


def test_an_immutable_file_is_exit_4_and_the_backup_made_for_it_goes_again(tmp_path, original_bytes) -> None:
    conn = tmp_path / "conn.py"
    conn.write_bytes(original_bytes)
    with immutable(conn) as reason:
        proc = forensics("apply", "--file", str(conn), "--yes")
        assert reason in proc.stderr
        _assert_exit_4_and_nothing_changed(proc, tmp_path, original_bytes, tmp_path)
