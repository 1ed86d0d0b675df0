"""Apply the codemod to a ``nixl/conn.py`` on disk: plan, backup, atomic write, validation.

The order is what makes it safe to run on a production engine's install:

1. plan: read the file, run the codemod in memory, show the steps and the diff;
2. backup: copy the original beside it (or into ``backup_dir``) and read the copy back;
   no backup, no write;
3. write: the new text goes to a temporary file in the same directory, is fsync'd,
   given the original's permissions, compiled, and only then ``os.replace``-d over the
   original (atomic on one filesystem: a reader sees the old file or the new one);
4. refuse if the file changed between plan and write.

:func:`plan_apply` and :func:`atomic_write` take no decisions about hosts, so the remote
deploy can reuse them with its own transport. :func:`restore_backup` is the rollback.
"""

from __future__ import annotations

import hashlib
import html
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from forensics.exitcodes import EnvironmentProblem
from patched_engine.codemod import PatchError, PatchResult, patch_source

BACKUP_SUFFIX = ".pd-forensics-backup"

ApplyStatus = Literal["planned", "applied", "already-patched"]


class ApplyError(PatchError):
    """The file was not written; the message says why (the original is untouched)."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ApplyPlan:
    """What applying the patch to one file would do; nothing has been written yet."""

    path: Path
    backup_path: Path
    patch: PatchResult
    sha256_before: str

    @property
    def needed(self) -> bool:
        return self.patch.changed

    def actions(self) -> list[str]:
        if not self.needed:
            return [f"nothing to do: {self.patch.headline()}"]
        return [
            f"copy {self.path} to {self.backup_path} and read the copy back",
            f"write the patched text to a temporary file in {self.path.parent}, fsync it, compile it",
            f"replace {self.path} atomically (os.replace); sha256 must still be {self.sha256_before[:12]}…",
        ]

    def to_dict(self) -> dict:
        return {
            "file": str(self.path),
            "backup": str(self.backup_path),
            "sha256_before": self.sha256_before,
            "actions": self.actions(),
            "patch": self.patch.to_dict(),
        }


@dataclass(frozen=True)
class ApplyResult:
    plan: ApplyPlan
    status: ApplyStatus
    backup: Path | None = None
    sha256_after: str | None = None

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "backup": str(self.backup) if self.backup else None,
            "sha256_after": self.sha256_after,
            **self.plan.to_dict(),
        }

    def headline(self) -> str:
        if self.status == "applied":
            return f"patched {self.plan.path} (backup: {self.backup})"
        if self.status == "already-patched":
            return f"{self.plan.path}: already patched, nothing written"
        return f"{self.plan.path}: plan only, nothing written (pass --yes / yes=True to apply)"

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(self.headline(), style="bold"), self.plan.patch.__rich__()]
        if self.status == "planned":
            parts += [Text(f"  {i}. {a}") for i, a in enumerate(self.plan.actions(), 1)]
        return Group(*parts)

    def _repr_html_(self) -> str:
        actions = "".join(f"<li>{html.escape(a)}</li>" for a in self.plan.actions())
        return f"<p><b>{html.escape(self.headline())}</b></p><ol>{actions}</ol>{self.plan.patch._repr_html_()}"


def backup_path_for(path: Path, backup_dir: Path | None = None, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S%fZ")
    directory = backup_dir if backup_dir is not None else path.parent
    return directory / f"{path.name}{BACKUP_SUFFIX}-{stamp}"


def plan_apply(path: str | Path, *, backup_dir: str | Path | None = None, release: str | None = None) -> ApplyPlan:
    """Read ``path`` and patch it in memory. Raises AnchorError/PatchError when it cannot be patched."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise EnvironmentProblem(f"{path}: no such file") from exc
    except (PermissionError, IsADirectoryError, UnicodeDecodeError) as exc:
        raise EnvironmentProblem(f"{path}: cannot read it: {exc}") from exc
    result = patch_source(text, release, label=str(path))
    return ApplyPlan(
        path=path,
        backup_path=backup_path_for(path, Path(backup_dir) if backup_dir is not None else None),
        patch=result,
        sha256_before=sha256_text(text),
    )


def atomic_write(path: Path, text: str, *, mode_from: Path | None = None) -> None:
    """Write ``text`` to ``path`` via a same-directory temp file, fsync, compile check, os.replace."""
    try:
        compile(text, str(path), "exec")
    except SyntaxError as exc:
        raise ApplyError(f"{path}: refusing to write text that does not compile: {exc}") from exc
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if mode_from is not None and mode_from.exists():
            shutil.copymode(mode_from, temp)
        # What lands on disk is what gets compiled, not the string we meant to write.
        compile(temp.read_text(encoding="utf-8"), str(path), "exec")
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_backup(plan: ApplyPlan) -> Path:
    backup = plan.backup_path
    try:
        backup.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(plan.path, backup)
        copied = backup.read_text(encoding="utf-8")
    except OSError as exc:
        raise ApplyError(f"{plan.path}: refusing to patch without a backup: cannot write {backup}: {exc}") from exc
    if sha256_text(copied) != plan.sha256_before:
        raise ApplyError(f"{plan.path}: refusing to patch: backup {backup} does not match the original")
    return backup


def execute_plan(plan: ApplyPlan) -> ApplyResult:
    """Carry out a plan: backup first, then the atomic write. The original is untouched on any error."""
    if not plan.needed:
        return ApplyResult(plan, "already-patched")
    current = plan.path.read_text(encoding="utf-8")
    if sha256_text(current) != plan.sha256_before:
        raise ApplyError(f"{plan.path}: changed since the plan was made; plan again")
    backup = _write_backup(plan)
    try:
        atomic_write(plan.path, plan.patch.new_text, mode_from=plan.path)
    except PermissionError as exc:
        raise EnvironmentProblem(f"{plan.path}: cannot write: {exc} (backup kept at {backup})") from exc
    return ApplyResult(plan, "applied", backup=backup, sha256_after=sha256_text(plan.patch.new_text))


def apply_file(
    path: str | Path, *, yes: bool = False, backup_dir: str | Path | None = None, release: str | None = None
) -> ApplyResult:
    """Patch ``path`` in place (with ``yes=True``); without it, return the plan and write nothing."""
    plan = plan_apply(path, backup_dir=backup_dir, release=release)
    if not yes:
        return ApplyResult(plan, "planned" if plan.needed else "already-patched")
    return execute_plan(plan)


def restore_backup(path: str | Path, backup: str | Path) -> None:
    """Rollback: put ``backup`` back at ``path`` atomically (the backup itself is kept)."""
    path, backup = Path(path), Path(backup)
    atomic_write(path, backup.read_text(encoding="utf-8"), mode_from=backup)
