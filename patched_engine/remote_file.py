"""Writing a file on a Host (local or SSH) so that a reader sees the old bytes or the new ones.

SFTP can neither chown nor write a root-owned site-packages, and paramiko has no remote
fsync, so a file reaches its place in four commands, every one an argument list run
through the Host (``sudo -n`` only where the host table says ``sudo = true``):

1. ``mktemp -d /tmp/pd-forensics-deploy.XXXXXXXX`` (a private 0700 directory of the login
   user), then the bytes go there with ``Host.put_file`` (SFTP: temporary name, rename);
2. ``install -o UID -g GID -m MODE TMPDIR/NAME DIR/.NAME.pd-forensics-deploy.tmp``: the
   owner, group and mode of the file it replaces, in the destination's directory (same
   file system, so the rename below is atomic); read back and compared by sha256;
3. ``sync``;
4. ``mv -f DIR/.NAME.pd-forensics-deploy.tmp DIR/NAME``, then ``sync`` again (the
   directory entry).

The temporary name in the destination directory is fixed (one per file), so a run killed
between 2 and 4 leaves at most that one file, which the next run's ``install`` overwrites;
it never ends in ``.py``, so nothing imports it. An ``install`` that fails (a full disk)
has its partial file removed at once (``rm -f -- TEMP``), and the error names that path.

Fault injection, for tests only: ``PD_FORENSICS_DEPLOY_KILL_AT`` set to one of
:data:`KILL_POINTS` (``after-upload``, ``after-install-temp``, ``before-mv``, ``after-mv``)
SIGKILLs the deployer at that step of the write of the patched (or restored) file.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from forensics.evidence import command_record
from forensics.exitcodes import EnvironmentProblem
from forensics.hosts import CommandResult, Host

KILL_ENV = "PD_FORENSICS_DEPLOY_KILL_AT"
KILL_POINTS = ("after-upload", "after-install-temp", "before-mv", "after-mv")
TEMP_SUFFIX = ".pd-forensics-deploy.tmp"
TMPDIR_TEMPLATE = "/tmp/pd-forensics-deploy.XXXXXXXX"
COMMAND_TIMEOUT_S = 120.0


def check_kill_env() -> None:
    value = os.environ.get(KILL_ENV)
    if value and value not in KILL_POINTS:
        raise EnvironmentProblem(f"{KILL_ENV}={value}: not a kill point (one of {', '.join(KILL_POINTS)})")


def kill_point(name: str | None) -> None:
    """The fault-injection hook (tests only): SIGKILL this process at step ``name`` if asked to."""
    if name is not None and os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def temp_name(dest: str) -> str:
    """``DIR/.NAME.pd-forensics-deploy.tmp``: where ``install`` puts the new bytes before the rename."""
    directory, name = posixpath.split(dest)
    return posixpath.join(directory, f".{name}{TEMP_SUFFIX}")


def result_record(result: CommandResult) -> dict[str, Any]:
    """A CommandResult as the deploy record keeps it: the manifest's record plus the output's last 4 KiB."""
    record = command_record(result)
    record["duration_s"] = round(result.duration_s, 4)
    record["stdout"] = result.stdout_text[-4096:]
    record["stderr"] = result.stderr_text[-4096:]
    return record


@dataclass
class Step:
    """One step of a deploy or rollback: what it did, how it ended, how long it took."""

    engine: str
    name: str
    state: str  # ok, failed, skipped
    duration_s: float = 0.0
    detail: str = ""
    commands: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "name": self.name, "state": self.state,
                "duration_s": round(self.duration_s, 4), "detail": self.detail, "commands": self.commands}


class StepFailed(EnvironmentProblem):
    """A command on the host failed; the step (with its CommandResult) is in the record."""


class Recorder:
    """Runs a deploy's commands on one Host and records every one of them as steps."""

    def __init__(self, host: Host, engine: str, *, sudo: bool, steps: list[Step],
                 on_step: Callable[[Step], None] | None = None) -> None:
        self.host = host
        self.engine = engine
        self.sudo = sudo
        self.steps = steps
        self.on_step = on_step

    def step(self, name: str) -> _StepContext:
        return _StepContext(self, name)

    def run(self, step: Step, argv: Sequence[str], *, sudo: bool = False, timeout: float = COMMAND_TIMEOUT_S,
            check: bool = True) -> CommandResult:
        result = self.host.run(list(argv), timeout=timeout, sudo=sudo)
        step.commands.append(result_record(result))
        if check and not result.ok:
            why = result.stderr_text.strip().splitlines()[-1:] or [result.error or result.state.value]
            raise StepFailed(f"{self.engine}: {step.name}: {result.summary()}: {why[0]}")
        return result


class _StepContext:
    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder = recorder
        self.step = Step(recorder.engine, name, "ok")
        self.started = 0.0

    def __enter__(self) -> Step:
        self.started = time.monotonic()
        return self.step

    def __exit__(self, kind, exc, tb) -> None:
        self.step.duration_s = time.monotonic() - self.started
        if exc is not None:
            self.step.state = "failed"
            self.step.detail = self.step.detail or str(exc)
        self.recorder.steps.append(self.step)
        if self.recorder.on_step is not None:
            self.recorder.on_step(self.step)


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    mode: int  # permission bits

    def install_args(self) -> list[str]:
        return ["-o", str(self.uid), "-g", str(self.gid), "-m", f"{self.mode:04o}"]


def make_tmpdir(rec: Recorder) -> str:
    with rec.step("make a private temporary directory") as step:
        result = rec.run(step, ["mktemp", "-d", TMPDIR_TEMPLATE])
        tmpdir = result.stdout_text.strip()
        if not tmpdir.startswith("/tmp/pd-forensics-deploy."):
            raise StepFailed(f"{rec.engine}: mktemp answered {tmpdir!r}")
        step.detail = tmpdir
    return tmpdir


def upload(rec: Recorder, tmpdir: str, name: str, data: bytes) -> str:
    """``data`` to ``TMPDIR/NAME`` on the host (SFTP over SSH); returns the remote path."""
    remote = posixpath.join(tmpdir, name)
    with rec.step(f"upload {name}") as step:
        fd, local = tempfile.mkstemp(prefix="pd-forensics-upload-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(local, 0o600)
            try:
                rec.host.put_file(local, remote)
            except OSError as exc:
                raise StepFailed(f"{rec.engine}: cannot upload to {remote}: {exc}") from exc
        finally:
            os.unlink(local)
        step.detail = f"{len(data)} bytes, sha256 {sha256(data)[:12]}… to {remote}"
    return remote


def install_atomically(rec: Recorder, source: str, dest: str, owner: Owner, data: bytes, *,
                       kill_points: bool = False) -> None:
    """``source`` (already on the host) to ``dest``: install to the temp name, read back, sync, mv, sync."""
    temp = temp_name(dest)
    with rec.step(f"install {posixpath.basename(dest)} as {posixpath.basename(temp)}") as step:
        result = rec.run(step, ["install", *owner.install_args(), source, temp], sudo=rec.sudo, check=False)
        if not result.ok:  # a full disk leaves a partial file under the temporary name: never keep it
            why = (result.stderr_text.strip().splitlines() or [result.error or result.state.value])[-1]
            removed = remove_partial(rec, step, temp)
            raise StepFailed(f"{rec.engine}: cannot write {temp}: {result.summary()}: {why}; {removed}; {dest} "
                             "untouched", path=temp)
        if kill_points:
            kill_point("after-install-temp")
        try:
            on_host = rec.host.read_file(temp)
        except OSError as exc:
            raise StepFailed(f"{rec.engine}: cannot read back {temp}: {exc}; {remove_partial(rec, step, temp)}",
                             path=temp) from exc
        if on_host != data:
            removed = remove_partial(rec, step, temp)
            raise StepFailed(f"{rec.engine}: {temp} does not read back as uploaded "
                             f"(sha256 {sha256(on_host)[:12]}…, expected {sha256(data)[:12]}…); {removed}; {dest} "
                             "untouched", path=temp)
        rec.run(step, ["sync"])
        step.detail = f"uid {owner.uid}, gid {owner.gid}, mode {owner.mode:04o}; read back, sha256 equal"
    if kill_points:
        kill_point("before-mv")
    with rec.step(f"rename over {dest}") as step:
        rec.run(step, ["mv", "-f", temp, dest], sudo=rec.sudo)
        if kill_points:
            kill_point("after-mv")
        rec.run(step, ["sync"])


def remove_partial(rec: Recorder, step: Step, temp: str) -> str:
    """``rm -f -- TEMP`` (through sudo where writes are): what a failed ``install`` left. Says how it went."""
    result = rec.run(step, ["rm", "-f", "--", temp], sudo=rec.sudo, check=False)
    if result.ok:
        return f"the partial {temp} is removed"
    why = (result.stderr_text.strip().splitlines() or [result.error or result.state.value])[-1]
    return f"the partial {temp} could NOT be removed ({why}): remove it by hand"


def remove_tmpdir(rec: Recorder, tmpdir: str) -> None:
    with rec.step("remove the temporary directory") as step:
        rec.run(step, ["rm", "-rf", "--", tmpdir], check=False)
