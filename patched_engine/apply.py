"""Apply the codemod to a ``nixl/conn.py`` on disk: plan, backup, atomic write, validation.

The order is what makes it safe to run on a production engine's install:

1. plan: resolve the path (a symlinked ``conn.py`` has its *target* patched and the link
   kept), read the file as bytes, run the codemod in memory on its text, show the steps
   and the diff. Nothing is written, nothing removed.
2. clean up: temporary files of an earlier run that was killed (named
   ``.<name>.pd-forensics-<pid>.tmp``) are removed, only when that pid no longer runs;
   so is the record of a backup that run never finished.
3. backup: a record (``<name>.pd-forensics-record-<stamp>.json``: the backup's sha256,
   size, owner, mode, the file it copies) and then the copy itself
   (``<name>.pd-forensics-backup-<stamp>``), each written like the file itself: a
   temporary file in the same directory, write, fsync, read back and compared, rename,
   fsync of the directory. A full disk or a killed process never leaves a partial file
   under the backup's name. No backup, no write.
4. write: the patched bytes go to a temporary file in the same directory (mode 0600
   while it is written), are fsync'd, given the original's owner, group and mode, read
   back, compiled, and only then ``os.replace``-d over the original (atomic on one
   filesystem: a reader sees the old file or the new one), then the directory is fsync'd.
5. refuse if the file changed between plan and write.

Any failure before the rename leaves the original as it was and removes what this run
wrote (the temporary file, and the backup and its record, which are redundant while the
original is intact). An ``OSError`` on the way (read-only file system, immutable
directory, full disk, no permission) is an :class:`EnvironmentProblem` naming the path:
exit status 4 in the CLI.

Text is kept as it was: the codemod works on text with ``\\n`` line endings and the
result is converted back at this boundary. Lines the patch does not touch keep their
bytes exactly (CRLF stays CRLF, a missing final newline stays missing), inserted lines
take the file's dominant line ending, and the encoding (a UTF-8 BOM, a PEP 263 coding
cookie such as latin-1) is the one the file declares.

Fault injection, for tests only: when the environment variable
``PD_FORENSICS_APPLY_KILL_AT`` names one of :data:`KILL_POINTS` (``after-backup-temp-write``,
``after-backup``, ``after-temp-write``, ``before-rename``, ``after-rename``), the process
SIGKILLs itself at that step, so a test can check what a kill at that moment leaves. Unset
(the normal case) it does nothing; an unknown value is refused before anything is written.

:func:`plan_apply` and :func:`atomic_write` take no decisions about hosts, so the remote
deploy can reuse them with its own transport. :func:`restore_backup` is the rollback.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import html
import io
import json
import os
import re
import signal
import stat
import tokenize
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from forensics.exitcodes import EnvironmentProblem
from patched_engine.codemod import PatchError, PatchResult, patch_source

BACKUP_SUFFIX = ".pd-forensics-backup"
RECORD_SUFFIX = ".pd-forensics-record"
TEMP_MARK = "pd-forensics"

KILL_ENV = "PD_FORENSICS_APPLY_KILL_AT"
KILL_POINTS = ("after-backup-temp-write", "after-backup", "after-temp-write", "before-rename", "after-rename")

ApplyStatus = Literal["planned", "applied", "already-patched"]

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\." + TEMP_MARK + r"-(?P<pid>\d+)\.tmp$")
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


class ApplyError(PatchError):
    """The file was not written; the message says why (the original is untouched)."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- text boundary


@dataclass(frozen=True)
class TextForm:
    """How a file's bytes become the codemod's text and back: encoding, BOM, line endings."""

    encoding: str  # a codec name as tokenize reports it ("utf-8", "utf-8-sig", "iso-8859-1", ...)
    newline: str  # the dominant line ending, used for inserted lines
    mixed: bool  # more than one kind of line ending in the file
    final_newline: bool

    @property
    def bom(self) -> bool:
        return self.encoding == "utf-8-sig"

    def describe(self) -> str:
        names = {"\r\n": "CRLF", "\n": "LF", "\r": "CR"}
        encoding = "UTF-8 with BOM" if self.bom else self.encoding
        endings = f"mixed line endings (new lines {names[self.newline]})" if self.mixed else (
            f"{names[self.newline]} line endings")
        final = "" if self.final_newline else ", no final newline"
        return f"{encoding}, {endings}{final}"

    def to_dict(self) -> dict:
        names = {"\r\n": "CRLF", "\n": "LF", "\r": "CR"}
        return {"encoding": self.encoding, "bom": self.bom, "newline": names[self.newline],
                "mixed_newlines": self.mixed, "final_newline": self.final_newline}


def _lines(text: str) -> list[str]:
    return _LINE_RE.findall(text)


def _normalize_line(line: str) -> str:
    body = line.rstrip("\r\n")
    return body + "\n" if len(body) != len(line) else body


def decode_source(data: bytes, label: str) -> tuple[str, TextForm]:
    """The file's text exactly as stored (line endings untouched) and how it is stored."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # undecodable first lines or an unknown coding cookie
        raise EnvironmentProblem(f"{label}: cannot read it: {exc}", path=label) from exc
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise EnvironmentProblem(f"{label}: cannot read it as {encoding}: {exc}", path=label) from exc
    if text.encode(encoding) != data:
        raise ApplyError(f"{label}: refusing to patch: its {encoding} text would not be written back byte for byte")
    endings = Counter()
    for line in _lines(text):
        ending = line[len(line.rstrip("\r\n")):]
        if ending:
            endings[ending] += 1
    newline = endings.most_common(1)[0][0] if endings else "\n"
    form = TextForm(encoding=encoding, newline=newline, mixed=len(endings) > 1,
                    final_newline=text.endswith(("\n", "\r")) or not text)
    return text, form


def normalize_newlines(text: str) -> str:
    """The text the codemod sees: every line ending ``\\n``."""
    return "".join(_normalize_line(line) for line in _lines(text))


def restore_text_form(stored: str, patched: str, form: TextForm) -> str:
    """``patched`` (``\\n`` endings) in the stored text's form: untouched lines keep their bytes."""
    old_lines = _lines(stored)
    new_lines = _lines(patched)
    matcher = difflib.SequenceMatcher(None, [_normalize_line(line) for line in old_lines], new_lines,
                                      autojunk=False)
    out: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(old_lines[i1:i2])
        else:
            out.extend(line[:-1] + form.newline if line.endswith("\n") else line for line in new_lines[j1:j2])
    result = "".join(out)
    if normalize_newlines(result) != patched:  # a bug here, never the user's
        raise ApplyError("the patched text could not be put back in the file's line endings; nothing written")
    return result


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class StaleFile:
    """A file an earlier, killed run left behind; removed by the next run that writes."""

    path: Path
    pid: int
    kind: Literal["temporary", "record"]

    def describe(self) -> str:
        if self.kind == "record":
            return (f"remove {self.path}, the record of a backup that was never finished "
                    f"(left by pid {self.pid}, no longer running)")
        return f"remove {self.path}, a stale temporary file (left by pid {self.pid}, no longer running)"


@dataclass(frozen=True)
class ApplyPlan:
    """What applying the patch to one file would do; nothing has been written yet."""

    path: Path
    backup_path: Path
    patch: PatchResult
    sha256_before: str
    target: Path | None = None  # the file really written (``path`` resolved)
    new_bytes: bytes = b""
    form: TextForm | None = None
    uid: int = -1
    gid: int = -1
    mode: int = 0
    nlink: int = 1
    symlink: bool = False  # ``path`` itself is a symlink (to ``target``)
    stale: tuple[StaleFile, ...] = ()

    @property
    def needed(self) -> bool:
        return self.patch.changed

    @property
    def file(self) -> Path:
        return self.target if self.target is not None else self.path

    @property
    def is_link(self) -> bool:
        return self.symlink

    @property
    def record_path(self) -> Path:
        return record_path_for(self.backup_path)

    @property
    def sha256_after(self) -> str:
        return sha256_bytes(self.new_bytes) if self.needed else self.sha256_before

    def notes(self) -> list[str]:
        notes = []
        if self.is_link:
            notes.append(f"{self.path} is a symlink to {self.file}; the target is patched, the link kept")
        if self.nlink > 1 and self.needed:
            notes.append(f"{self.file} has {self.nlink} hard links; only this name gets the patched file, "
                         "the other names keep the original")
        notes += [s.describe() for s in self.stale]
        return notes

    def actions(self) -> list[str]:
        if not self.needed:
            return [f"nothing to do: {self.patch.headline()}", *self.notes()]
        form = f" ({self.form.describe()}, as the original)" if self.form is not None else ""
        owner = f"owner {self.uid}:{self.gid} and mode {self.mode:04o}" if self.uid >= 0 else "the original's mode"
        return [
            *self.notes(),
            f"record the backup's sha256 ({self.sha256_before[:12]}…) in {self.record_path}, then copy "
            f"{self.file} to {self.backup_path} (temporary file, fsync, read back, rename, directory fsync)",
            f"write the patched text{form} to a temporary file in {self.file.parent}, fsync it, "
            f"give it {owner}, compile it",
            f"replace {self.file} atomically (os.replace) and fsync its directory; "
            f"sha256 must still be {self.sha256_before[:12]}…",
        ]

    def to_dict(self) -> dict:
        return {
            "file": str(self.path),
            "target": str(self.file),
            "symlink": self.is_link,
            "backup": str(self.backup_path),
            "record": str(self.record_path),
            "sha256_before": self.sha256_before,
            "owner": {"uid": self.uid, "gid": self.gid, "mode": f"{self.mode:04o}"},
            "text": self.form.to_dict() if self.form is not None else None,
            "stale": [str(s.path) for s in self.stale],
            "actions": self.actions(),
            "patch": self.patch.to_dict(),
        }


@dataclass(frozen=True)
class ApplyResult:
    plan: ApplyPlan
    status: ApplyStatus
    backup: Path | None = None
    sha256_after: str | None = None
    record: Path | None = None
    removed_stale: tuple[Path, ...] = ()

    def to_dict(self) -> dict:
        # The plan's backup and record paths (where they go, or went) follow the outcome's fields.
        return {
            "status": self.status,
            "backup_sha256": self.plan.sha256_before if self.backup else None,
            "sha256_after": self.sha256_after,
            "removed_stale": [str(p) for p in self.removed_stale],
            **self.plan.to_dict(),
        }

    def headline(self) -> str:
        if self.status == "applied":
            return f"patched {self.plan.file} (backup: {self.backup})"
        if self.status == "already-patched":
            return f"{self.plan.path}: already patched, nothing written"
        return f"{self.plan.path}: plan only, nothing written (pass --yes / yes=True to apply)"

    def _shown_actions(self) -> list[str]:
        if self.status == "planned":
            return self.plan.actions()
        return self.plan.notes() if self.status == "already-patched" and not self.removed_stale else []

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        parts = [Text(self.headline(), style="bold"), self.plan.patch.__rich__()]
        parts += [Text(f"  {i}. {a}") for i, a in enumerate(self._shown_actions(), 1)]
        parts += [Text(f"  removed {p}, left by a killed run") for p in self.removed_stale]
        return Group(*parts)

    def _repr_html_(self) -> str:
        actions = "".join(f"<li>{html.escape(a)}</li>" for a in self.plan.actions())
        return f"<p><b>{html.escape(self.headline())}</b></p><ol>{actions}</ol>{self.plan.patch._repr_html_()}"


def backup_path_for(path: Path, backup_dir: Path | None = None, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S%fZ")
    directory = backup_dir if backup_dir is not None else path.parent
    return directory / f"{path.name}{BACKUP_SUFFIX}-{stamp}"


def record_path_for(backup: Path) -> Path:
    """``conn.py.pd-forensics-backup-<stamp>`` -> ``conn.py.pd-forensics-record-<stamp>.json``."""
    head, sep, stamp = backup.name.rpartition(BACKUP_SUFFIX + "-")
    if not sep:
        return backup.with_name(backup.name + RECORD_SUFFIX + ".json")
    return backup.with_name(f"{head}{RECORD_SUFFIX}-{stamp}.json")


def _resolve(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except FileNotFoundError as exc:
        if path.is_symlink():
            raise EnvironmentProblem(f"{path}: no such file (a dangling symlink to {os.readlink(path)})",
                                     path=str(path)) from exc
        raise EnvironmentProblem(f"{path}: no such file", path=str(path)) from exc
    except (OSError, RuntimeError) as exc:
        raise EnvironmentProblem(f"{path}: cannot resolve it: {exc}", path=str(path)) from exc


def _read(target: Path, label: Path) -> tuple[bytes, os.stat_result]:
    try:
        with open(target, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise EnvironmentProblem(f"{label}: not a regular file", path=str(label))
            return handle.read(), info
    except (PermissionError, IsADirectoryError) as exc:
        raise EnvironmentProblem(f"{label}: cannot read it: {exc}", path=str(label)) from exc
    except OSError as exc:
        raise EnvironmentProblem(f"{label}: cannot read it: {exc.strerror or exc}", path=str(label)) from exc


def plan_apply(path: str | Path, *, backup_dir: str | Path | None = None, release: str | None = None) -> ApplyPlan:
    """Read ``path`` and patch it in memory. Raises AnchorError/PatchError when it cannot be patched."""
    path = Path(path)
    target = _resolve(path)
    data, info = _read(target, path)
    stored, form = decode_source(data, str(path))
    result = patch_source(normalize_newlines(stored), release, label=str(path))
    new_bytes = data
    if result.changed:
        try:
            new_bytes = restore_text_form(stored, result.new_text, form).encode(form.encoding)
        except UnicodeEncodeError as exc:
            raise ApplyError(f"{path}: refusing to patch: the inserted lines cannot be written as "
                             f"{form.encoding}: {exc}") from exc
    backup = backup_path_for(target, Path(backup_dir) if backup_dir is not None else None)
    return ApplyPlan(
        path=path,
        backup_path=backup,
        patch=result,
        sha256_before=sha256_bytes(data),
        target=target,
        new_bytes=new_bytes,
        form=form,
        uid=info.st_uid,
        gid=info.st_gid,
        mode=stat.S_IMODE(info.st_mode),
        nlink=info.st_nlink,
        symlink=path.is_symlink(),
        stale=tuple(find_stale(target, backup.parent)),
    )


# ----------------------------------------------------------------------------- stale files of killed runs


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process never leaves its own temporary files behind
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError, OSError):
        return False
    return True


def _ours(name: str, target_name: str) -> bool:
    return name == target_name or name.startswith((target_name + BACKUP_SUFFIX + "-",
                                                   target_name + RECORD_SUFFIX + "-"))


def find_stale(target: Path, backup_dir: Path | None = None) -> list[StaleFile]:
    """Temporary files (and unfinished backup records) of earlier runs on ``target`` whose pid is gone."""
    found: list[StaleFile] = []
    directories = [target.parent]
    if backup_dir is not None and backup_dir != target.parent:
        directories.append(backup_dir)
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            match = _TEMP_RE.match(name)
            if match and _ours(match["name"], target.name) and int(match["pid"]) > 0:
                pid = int(match["pid"])
                if not _pid_alive(pid):
                    found.append(StaleFile(directory / name, pid, "temporary"))
                continue
            if name.startswith(target.name + RECORD_SUFFIX + "-") and name.endswith(".json"):
                record = directory / name
                try:
                    content = json.loads(record.read_text(encoding="utf-8"))
                    backup = directory / content["backup"]
                    pid = int(content["pid"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # not one we can judge: leave it
                if not backup.exists() and pid > 0 and not _pid_alive(pid):
                    found.append(StaleFile(record, pid, "record"))
    return found


def _remove_stale(plan: ApplyPlan) -> tuple[Path, ...]:
    removed = []
    directories = set()
    for stale in find_stale(plan.file, plan.backup_path.parent):
        try:
            stale.path.unlink(missing_ok=True)
        except OSError as exc:
            raise EnvironmentProblem(f"{stale.path}: cannot remove this file a killed run left: "
                                     f"{exc.strerror or exc} (nothing changed)", path=str(stale.path)) from exc
        removed.append(stale.path)
        directories.add(stale.path.parent)
    for directory in directories:
        _fsync_directory(directory)
    return tuple(removed)


# ----------------------------------------------------------------------------- writing


def _kill_point(name: str | None) -> None:
    """The fault-injection hook (tests only): SIGKILL this process at step ``name`` if asked to."""
    if name is not None and os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _check_kill_env() -> None:
    value = os.environ.get(KILL_ENV)
    if value and value not in KILL_POINTS:
        raise EnvironmentProblem(f"{KILL_ENV}={value}: not a kill point (one of {', '.join(KILL_POINTS)})")


def temp_path_for(final: Path) -> Path:
    return final.with_name(f".{final.name}.{TEMP_MARK}-{os.getpid()}.tmp")


class _OwnerError(OSError):
    """The temporary file cannot be given the original's owner."""


def _take_owner_and_mode(fd: int, like: os.stat_result, *, strict_owner: bool) -> None:
    current = os.fstat(fd)
    if (current.st_uid, current.st_gid) != (like.st_uid, like.st_gid):
        try:
            os.fchown(fd, like.st_uid, like.st_gid)
        except PermissionError as exc:
            if strict_owner:
                raise _OwnerError(exc.errno, f"cannot keep its owner {like.st_uid}:{like.st_gid} "
                                             f"({exc.strerror}); run as root or as its owner") from exc
    os.fchmod(fd, stat.S_IMODE(like.st_mode))  # after chown, which may clear set-id bits


def _write_atomically(final: Path, data: bytes, *, like: os.stat_result | None, strict_owner: bool = True,
                      compile_check: bool = False, after_temp_write: str | None = None,
                      before_rename: str | None = None, after_rename: str | None = None) -> None:
    """``data`` to ``final`` via a same-directory temp file: write, fsync, owner and mode, read back,
    (compile), rename, directory fsync. On any error the temp file is removed and ``final`` untouched."""
    temp = temp_path_for(final)
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()  # ours by name: this process is the only one with this pid
    # 0600 while the bytes go in when the mode is copied afterwards; else the usual umask.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600 if like is not None else 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            _kill_point(after_temp_write)
            if like is not None:
                _take_owner_and_mode(fd, like, strict_owner=strict_owner)
                os.fsync(fd)
        finally:
            os.close(fd)
        with open(temp, "rb") as handle:
            on_disk = handle.read()
        if on_disk != data:
            raise ApplyError(f"{final}: the temporary file {temp} does not read back as written; nothing replaced")
        if compile_check:
            try:
                compile(on_disk, str(final), "exec")  # what lands on disk is what gets compiled
            except (SyntaxError, ValueError) as exc:
                raise ApplyError(f"{final}: refusing to write text that does not compile: {exc}") from exc
        _kill_point(before_rename)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    _kill_point(after_rename)
    _fsync_directory(final.parent)


def atomic_write(path: Path, text: str | bytes, *, mode_from: Path | None = None) -> None:
    """Write ``text`` to ``path`` via a same-directory temp file, fsync, compile check, os.replace.

    ``mode_from`` gives the new file that file's owner, group and mode. ``OSError`` passes
    through; a text that does not compile is an :class:`ApplyError` and nothing is written.
    """
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        compile(data, str(path), "exec")
    except (SyntaxError, ValueError) as exc:
        raise ApplyError(f"{path}: refusing to write text that does not compile: {exc}") from exc
    like = os.stat(mode_from) if mode_from is not None and mode_from.exists() else None
    _write_atomically(path, data, like=like, compile_check=True)


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


def _problem(plan: ApplyPlan, exc: OSError, doing: str, where: Path) -> EnvironmentProblem:
    reason = exc.strerror or str(exc)
    problem = EnvironmentProblem(f"{plan.path}: {doing} {where}: {reason} (nothing changed)", path=str(where))
    problem.__cause__ = exc
    return problem


def _private(info: os.stat_result) -> os.stat_result:
    """``info`` with mode 0600: a backup and its record keep the file's owner but only the owner reads them."""
    return os.stat_result((stat.S_IFREG | 0o600, *tuple(info)[1:]))


def _write_backup(plan: ApplyPlan, data: bytes, info: os.stat_result) -> tuple[Path, Path]:
    backup, record = plan.backup_path, plan.record_path
    content = {
        "backup": backup.name,
        "of": str(plan.file),
        "link": str(plan.path) if plan.is_link else None,
        "sha256": sha256_bytes(data),
        "size": len(data),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
        "pid": os.getpid(),
        "created": datetime.now(UTC).isoformat(),
    }
    try:
        backup.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(record, (json.dumps(content, indent=1) + "\n").encode(), like=_private(info),
                          strict_owner=False)
        try:
            _write_atomically(backup, data, like=_private(info), strict_owner=False,
                              after_temp_write="after-backup-temp-write")
        except BaseException:
            with contextlib.suppress(OSError):
                record.unlink()
            raise
    except OSError as exc:
        raise _problem(plan, exc, "refusing to patch without a backup: cannot write", backup) from exc
    _kill_point("after-backup")
    return backup, record


def _discard_backup(plan: ApplyPlan, backup: Path, record: Path) -> None:
    """After a failed write: the backup is redundant while the original is intact, so nothing is left changed."""
    try:
        with open(plan.file, "rb") as handle:
            if sha256_bytes(handle.read()) != plan.sha256_before:
                return
    except OSError:
        return
    for path in (backup, record):
        with contextlib.suppress(OSError):
            path.unlink()
    _fsync_directory(backup.parent)


def execute_plan(plan: ApplyPlan) -> ApplyResult:
    """Carry out a plan: clean up, backup, then the atomic write. The original is untouched on any error."""
    _check_kill_env()
    removed = _remove_stale(plan)
    if not plan.needed:
        return ApplyResult(plan, "already-patched", removed_stale=removed)
    if _resolve(plan.path) != plan.file:
        raise ApplyError(f"{plan.path}: now points to {_resolve(plan.path)}, not {plan.file}; plan again")
    data, info = _read(plan.file, plan.path)
    if sha256_bytes(data) != plan.sha256_before:
        raise ApplyError(f"{plan.path}: changed since the plan was made; plan again")
    backup, record = _write_backup(plan, data, info)
    try:
        _write_atomically(plan.file, plan.new_bytes, like=info, strict_owner=True, compile_check=True,
                          after_temp_write="after-temp-write", before_rename="before-rename",
                          after_rename="after-rename")
    except BaseException as exc:
        _discard_backup(plan, backup, record)
        if isinstance(exc, OSError):
            raise _problem(plan, exc, "cannot write the patched file in", plan.file.parent) from exc
        raise
    return ApplyResult(plan, "applied", backup=backup, sha256_after=sha256_bytes(plan.new_bytes), record=record,
                       removed_stale=removed)


def apply_file(
    path: str | Path, *, yes: bool = False, backup_dir: str | Path | None = None, release: str | None = None
) -> ApplyResult:
    """Patch ``path`` in place (with ``yes=True``); without it, return the plan and write nothing."""
    plan = plan_apply(path, backup_dir=backup_dir, release=release)
    if not yes:
        return ApplyResult(plan, "planned" if plan.needed else "already-patched")
    return execute_plan(plan)


def verify_backup(backup: str | Path) -> str:
    """The backup's sha256, checked against its record when there is one (ApplyError on a mismatch)."""
    backup = Path(backup)
    data = backup.read_bytes()
    digest = sha256_bytes(data)
    record = record_path_for(backup)
    if record.exists():
        try:
            recorded = json.loads(record.read_text(encoding="utf-8")).get("sha256")
        except (ValueError, AttributeError) as exc:
            raise ApplyError(f"{backup}: its record {record} cannot be read: {exc}") from exc
        if recorded != digest:
            raise ApplyError(f"{backup}: sha256 {digest[:12]}… does not match {recorded!s:.12}… recorded in {record}")
    return digest


def _recorded_mode(backup: Path) -> os.stat_result:
    """The backup's owner with the mode its record kept (the backup itself is 0600)."""
    info = os.stat(backup)
    try:
        mode = int(json.loads(record_path_for(backup).read_text(encoding="utf-8"))["mode"], 8)
    except (OSError, ValueError, KeyError, TypeError):
        return info
    return os.stat_result((stat.S_IFREG | stat.S_IMODE(mode), *tuple(info)[1:]))


def restore_backup(path: str | Path, backup: str | Path) -> None:
    """Rollback: put ``backup`` back at ``path`` atomically (the backup itself is kept).

    A symlinked ``path`` has its target restored; the file keeps its current owner and mode
    (the backup's when it is gone).
    """
    path, backup = Path(path), Path(backup)
    target = path.resolve() if path.is_symlink() else path
    try:
        verify_backup(backup)
        data = backup.read_bytes()
        like = os.stat(target) if target.exists() else _recorded_mode(backup)
        _write_atomically(target, data, like=like, compile_check=True)
    except OSError as exc:
        where = exc.filename or target
        raise EnvironmentProblem(f"{path}: cannot restore {backup}: {exc.strerror or exc} ({where})",
                                 path=str(where)) from exc
