"""Applying the patch to a file on disk: plan without --yes, backup, atomic replace, rollback."""

from __future__ import annotations

import os
import stat

import pytest

from forensics.exitcodes import EnvironmentProblem
from forensics.sglang_source import fetch
from patched_engine import snippets
from patched_engine.apply import (
    ApplyError,
    apply_file,
    atomic_write,
    execute_plan,
    plan_apply,
    restore_backup,
)
from patched_engine.codemod import AnchorError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def original() -> str:
    return fetch("0.5.15").backend_file("nixl").read_text(encoding="utf-8")


@pytest.fixture
def conn_file(tmp_path, original):
    path = tmp_path / "site-packages" / "sglang" / "srt" / "disaggregation" / "nixl" / "conn.py"
    path.parent.mkdir(parents=True)
    path.write_text(original)
    path.chmod(0o640)
    return path


def test_without_yes_only_plans(conn_file, original) -> None:
    result = apply_file(conn_file)
    assert result.status == "planned"
    assert conn_file.read_text() == original
    assert not list(conn_file.parent.glob("*backup*"))
    assert any("os.replace" in action for action in result.plan.actions())
    assert result.plan.patch.changed


def test_apply_keeps_a_verified_backup_and_the_mode(conn_file, original) -> None:
    result = apply_file(conn_file, yes=True, release="0.5.15")
    assert result.status == "applied"
    patched = conn_file.read_text()
    assert snippets.SENTINEL_NAME in patched and patched == result.plan.patch.new_text
    assert result.backup is not None and result.backup.parent == conn_file.parent
    assert result.backup.read_text() == original
    assert stat.S_IMODE(conn_file.stat().st_mode) == 0o640
    # No temporary file is left behind next to the target; the backup's sha256 is recorded beside it.
    assert sorted(p.name for p in conn_file.parent.iterdir()) == sorted(
        ["conn.py", result.backup.name, result.record.name])
    compile(patched, str(conn_file), "exec")

    again = apply_file(conn_file, yes=True)
    assert again.status == "already-patched"
    assert conn_file.read_text() == patched
    assert len(list(conn_file.parent.glob("*backup*"))) == 1 and len(list(conn_file.parent.glob("*record*"))) == 1

    restore_backup(conn_file, result.backup)
    assert conn_file.read_text() == original


def test_backup_dir_is_honoured(conn_file, original, tmp_path) -> None:
    backups = tmp_path / "backups"
    result = apply_file(conn_file, yes=True, backup_dir=backups)
    assert result.status == "applied"
    assert result.backup.parent == backups and result.backup.read_text() == original
    assert not list(conn_file.parent.glob("*backup*"))  # none beside the target


def test_refuses_without_a_backup(conn_file, original, tmp_path) -> None:
    if os.geteuid() == 0:
        # root ignores directory permissions; a file where the directory should be does it.
        blocked = tmp_path / "not-a-dir"
        blocked.write_text("")
        backup_dir = blocked / "sub"
    else:
        backup_dir = tmp_path / "ro"
        backup_dir.mkdir()
        backup_dir.chmod(0o500)
    # An unwritable backup place is the environment's problem (exit 4), naming where.
    with pytest.raises(EnvironmentProblem, match="without a backup") as caught:
        apply_file(conn_file, yes=True, backup_dir=backup_dir)
    assert str(backup_dir) in str(caught.value)
    assert conn_file.read_text() == original


def test_refuses_when_the_file_changed_after_the_plan(conn_file, original) -> None:
    plan = plan_apply(conn_file)
    conn_file.write_text(original + "\n# edited meanwhile\n")
    with pytest.raises(ApplyError, match="changed since the plan"):
        execute_plan(plan)
    assert conn_file.read_text().endswith("# edited meanwhile\n")


def test_mangled_file_is_refused_and_untouched(conn_file, original) -> None:
    conn_file.write_text(original.replace("class NixlKVManager(", "class Other("))
    with pytest.raises(AnchorError, match="manager-class"):
        apply_file(conn_file, yes=True)
    assert "class Other(" in conn_file.read_text()
    assert not list(conn_file.parent.glob("*backup*"))


def test_atomic_write_never_leaves_a_half_file(tmp_path) -> None:
    target = tmp_path / "conn.py"
    target.write_text("x = 1\n")
    with pytest.raises(ApplyError, match="does not compile"):
        atomic_write(target, "def broken(:\n")
    assert target.read_text() == "x = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["conn.py"]


def test_missing_file_is_an_environment_problem(tmp_path) -> None:
    with pytest.raises(EnvironmentProblem, match="no such file"):
        apply_file(tmp_path / "absent.py")
