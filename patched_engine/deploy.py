"""Deploy the patched ``nixl/conn.py`` to a deployment's prefill engines, check it, roll it back.

    from patched_engine import deploy
    plan = deploy.plan_deploy("inventory.toml")        # reads only: locate, diff, known-release check
    plan.commands()                                    # every command the deploy would run, in order
    record = deploy.deploy("inventory.toml", yes=True) # backup, atomic write, compile, restart, LIVENESS
    deploy.status("inventory.toml").exit_status        # 0 all patched, 1 any original/unknown, 3 unreadable
    deploy.rollback("inventory.toml", yes=True)        # the backup back, byte for byte; restart; liveness

The bootstrap loop the patch fixes (``NixlKVManager``'s ``bootstrap_thread``) runs on the
*prefill*: only prefill engines are patched and restarted. A decode sharing the same
install picks the file up at its next restart (the patch leaves its code paths alone).

For each prefill engine, on its Host (``LocalHost`` or ``SSHHost``, from the inventory):

1. locate sglang with the engine's own interpreter (``PYTHON -c LOCATE_SCRIPT [LOCATION]``,
   :mod:`patched_engine.locate`): package directory, release (``importlib.metadata``), and
   ``nixl/conn.py``'s real path, owner, group, mode and sha256;
2. the known-release check: the file must equal the same file in the wheel of the release
   the target reports (:func:`forensics.sglang_source.fetch`); anything else is a fork,
   refused unless ``force=True`` (the diff is shown first either way);
3. the codemod in memory (line endings and encoding kept, :mod:`patched_engine.apply`);
   the plan and the diff. Without ``yes=True`` that is all that happens on a live
   deployment; a twin (an inventory with a ``[twin]`` table) needs no ``yes``;
4. compile check of the patched bytes with the target interpreter
   (``PYTHON -m py_compile`` on the uploaded copy in a private temporary directory);
5. backup: a record (sha256, size, owner, mode) and the original's bytes beside the file
   (``conn.py.pd-forensics-record-STAMP.json``, ``conn.py.pd-forensics-backup-STAMP``),
   each written atomically; no backup, no write;
6. the patched file, atomically with the original's owner, group and mode
   (:mod:`patched_engine.remote_file`: upload, ``install``, read back, ``sync``, ``mv``);
7. its bytecode removed (``rm -f .../__pycache__/conn.*.pyc``);
8. the engine restarted with the inventory's ``restart`` line (an argument list through
   ``shlex.split``; a leading ``sudo`` gets ``-n``: never a password prompt), then
   LIVENESS: a real one-token request through the deployment (the router, else each
   prefill+decode pair) until it answers or the deadline passes. ``/health`` is not
   enough: it answered 200 all through the incident.

Every step is recorded (:class:`DeployRecord`: each step's state, duration and the
``CommandResult`` of each of its commands). Killing the deployer at any moment leaves the
file either original or patched, never partial: the only write to ``conn.py`` is a rename.
"""

from __future__ import annotations

import html
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from forensics.exitcodes import BAD, GOOD, INCONCLUSIVE, EnvironmentProblem, ExitStatus
from patched_engine import remote_file
from patched_engine.locate import Located, locate, locate_argv
from patched_engine.remote_file import Owner, Recorder, Step, StepFailed, result_record
from patched_engine.snippets import PATCH_ID

SENTINEL_RE = re.compile(r'^PD_FORENSICS_PATCH\s*=\s*["\']([^"\']+)["\']', re.M)
DEFAULT_LIVENESS_DEADLINE_S = 600.0
DEFAULT_RESTART_TIMEOUT_S = 600.0
PLACEHOLDER_TMPDIR = "/tmp/pd-forensics-deploy.XXXXXXXX"
PLACEHOLDER_STAMP = "STAMP"
# A backup and its record: their owner reads them, nobody else. Only without sudo: through
# sudo they are root's, and the operator reads them back (and a rollback reads the backup)
# without sudo, so there they keep the modes docs/LIVE.md's sudoers rules name.
BACKUP_MODE = 0o600


def _inventory(source: Any):
    import forensics.inventory as inventory_mod

    if hasattr(source, "engines"):
        return source, None
    inventory_path = getattr(source, "inventory_path", None)
    path = Path(inventory_path if inventory_path is not None else source)
    return inventory_mod.load(path), path


def patch_id_of(data: bytes) -> str | None:
    """The patch id a file carries (``PD_FORENSICS_PATCH = "..."``), or None."""
    match = SENTINEL_RE.search(data.decode("utf-8", errors="replace"))
    return match.group(1) if match else None


def restart_argv(line: str) -> list[str]:
    """The inventory's restart line as an argument list; ``sudo`` gets ``-n`` (fail, never prompt)."""
    argv = shlex.split(line)
    if argv and argv[0] in ("sudo", "/usr/bin/sudo") and "-n" not in argv[1:2]:
        argv = [argv[0], "-n", *argv[1:]]
    return argv


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


# ----------------------------------------------------------------------------- the wheel


@dataclass(frozen=True)
class Release:
    version: str
    conn_bytes: bytes

    @property
    def sha256(self) -> str:
        return remote_file.sha256(self.conn_bytes)


def release_conn(version: str) -> Release:
    """The pristine ``nixl/conn.py`` of ``version``'s wheel (SourceError, exit 4, when it cannot be had)."""
    from forensics.sglang_source import fetch

    source = fetch(version)
    path = source.backend_file("nixl")
    return Release(version, source.verified_read_bytes(path))


# ----------------------------------------------------------------------------- the plan


@dataclass
class EnginePlan:
    """What deploying to one prefill engine would do (nothing has been written)."""

    engine: str
    label: str
    host: str
    python: str
    sudo: bool
    restart: list[str] | None
    located: Located
    original: bytes
    kind: str  # "original" (the release's own file), "patched", "fork" (anything else)
    release: str | None
    release_sha256: str | None
    reason: str
    new_bytes: bytes = b""
    diff: str = ""
    patch: Any = None  # PatchResult
    patch_id: str | None = None
    problem: str | None = None  # the codemod refused, or the write cannot be done as this user

    @property
    def path(self) -> str:
        return self.located.path

    @property
    def directory(self) -> str:
        return self.path.rsplit("/", 1)[0]

    @property
    def sha256_before(self) -> str:
        return remote_file.sha256(self.original)

    @property
    def needed(self) -> bool:
        return self.kind != "patched" and self.problem is None and bool(self.new_bytes) and \
            self.new_bytes != self.original

    @property
    def owner(self) -> Owner:
        f = self.located.file or {}
        return Owner(int(f["uid"]), int(f["gid"]), int(f["mode"]))

    def backup_paths(self, stamp: str = PLACEHOLDER_STAMP) -> tuple[str, str]:
        name = self.path.rsplit("/", 1)[1]
        return (f"{self.directory}/{name}.pd-forensics-backup-{stamp}",
                f"{self.directory}/{name}.pd-forensics-record-{stamp}.json")

    def backup_owners(self) -> tuple[Owner, Owner]:
        """The record's and the backup's owner and mode: 0600 unless written through sudo (BACKUP_MODE)."""
        owner = self.owner
        if not self.sudo:
            return Owner(owner.uid, owner.gid, BACKUP_MODE), Owner(owner.uid, owner.gid, BACKUP_MODE)
        return Owner(owner.uid, owner.gid, 0o644), owner

    def write_commands(self, tmpdir: str = PLACEHOLDER_TMPDIR, stamp: str = PLACEHOLDER_STAMP) -> list[list[str]]:
        """The commands that write the backup and the patched file (the uploads are SFTP, not commands)."""
        backup, record = self.backup_paths(stamp)
        sudo = ["sudo", "-n", "--"] if self.sudo else []
        owner = self.owner
        commands = [["mktemp", "-d", remote_file.TMPDIR_TEMPLATE],
                    [self.python, "-m", "py_compile", f"{tmpdir}/conn.py"]]
        record_owner, backup_owner = self.backup_owners()
        for source, dest, who in ((f"{tmpdir}/record.json", record, record_owner),
                                  (f"{tmpdir}/backup", backup, backup_owner), (f"{tmpdir}/conn.py", self.path, owner)):
            temp = remote_file.temp_name(dest)
            commands += [[*sudo, "install", *who.install_args(), source, temp], ["sync"],
                         [*sudo, "mv", "-f", temp, dest], ["sync"]]
        return commands

    def finish_commands(self) -> list[list[str]]:
        """Each of conn.py's bytecode files removed (one ``rm`` per file), then the restart."""
        sudo = ["sudo", "-n", "--"] if self.sudo else []
        commands = [[*sudo, "rm", "-f", "--", pyc] for pyc in (self.located.file or {}).get("pycache") or []]
        if self.restart:
            commands.append(self.restart)
        return commands

    def actions(self) -> list[str]:
        if self.problem:
            return [f"refused: {self.problem}"]
        if self.kind == "patched":
            return [f"nothing to write: {self.path} already carries {self.patch_id}"]
        backup, record = self.backup_paths()
        who = "through sudo -n" if self.sudo else "as the login user (sudo = false)"
        owner = self.owner
        steps = [
            f"the bootstrap loop runs on this prefill engine ({self.label}); its file is {self.path}",
            f"compile the patched file with {self.python} (-m py_compile, in a private temporary directory)",
            f"back up the original (sha256 {self.sha256_before[:12]}…) to {backup}, its record in {record}",
            f"install the patched file {who} as {remote_file.temp_name(self.path)} with uid {owner.uid}, "
            f"gid {owner.gid}, mode {owner.mode:04o}; read it back; sync; mv over {self.path}; sync",
            f"remove its bytecode ({self.directory}/__pycache__/conn.*.pyc)",
        ]
        if self.restart:
            steps.append(f"restart: {shlex.join(self.restart)}")
        else:
            steps.append("no restart line in the inventory: restart the engine yourself")
        return steps

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "label": self.label, "host": self.host, "python": self.python,
            "sudo": self.sudo, "package_dir": self.located.package_dir, "file": self.path,
            "symlink": bool((self.located.file or {}).get("symlink")),
            "release": self.release, "release_source": self.located.version_source,
            "release_sha256": self.release_sha256, "sha256": self.sha256_before, "kind": self.kind,
            "reason": self.reason, "patch_id": self.patch_id, "problem": self.problem, "needed": self.needed,
            "owner": {"uid": self.owner.uid, "gid": self.owner.gid, "mode": f"{self.owner.mode:04o}"},
            "restart": self.restart, "actions": self.actions(), "diff": self.diff,
            "stale_temp": bool((self.located.file or {}).get("stale_temp")),
        }


@dataclass
class DeployPlan:
    inventory: str | None
    deployment: str
    twin: bool
    engines: list[EnginePlan]
    # Decodes whose release blocks on a send to a restarted prefill (patched_engine.decode_hazard),
    # and the decodes for which that could not be decided (why).
    decode_hazards: list = field(default_factory=list)
    decode_undecided: list[str] = field(default_factory=list)
    restart_decodes: bool = False  # the deploy restarts the decodes of decode_hazards after the prefills

    @property
    def forks(self) -> list[EnginePlan]:
        return [e for e in self.engines if e.kind == "fork"]

    def commands(self) -> list[dict[str, Any]]:
        """Every command the deploy would run, in order, per engine (uploads go by SFTP, not listed)."""
        out = []
        for e in self.engines:
            steps = [locate_argv(e.python, e.located.raw.get("location"))]
            if e.needed:
                steps += e.write_commands() + e.finish_commands()
            out += [{"engine": e.engine, "host": e.host, "argv": argv} for argv in steps]
        if self.restart_decodes:
            out += [{"engine": h.engine, "host": h.host, "argv": h.restart} for h in self.decode_hazards if h.restart]
        return out

    def warnings(self) -> list[str]:
        """What the plan's reader must know before a restart: decodes that may block, or may not be known."""
        remedy = ("; the deploy restarts it after the prefill" if self.restart_decodes else
                  "; pass --restart-decodes (restart_decodes=True) to restart it after the prefill, or stop its "
                  "traffic and let its waiting requests time out (SGLANG_DISAGGREGATION_WAITING_TIMEOUT) first")
        return [h.describe() + remedy for h in self.decode_hazards] + self.decode_undecided

    def to_dict(self) -> dict[str, Any]:
        return {"inventory": self.inventory, "deployment": self.deployment, "twin": self.twin,
                "engines": [e.to_dict() for e in self.engines],
                "decode_hazards": [h.to_dict() for h in self.decode_hazards],
                "decode_undecided": self.decode_undecided}


def _plan_engine(inv, engine, *, release_cache: dict[str, Release | Exception]) -> EnginePlan:
    from patched_engine.apply import ApplyError, decode_source, normalize_newlines, restore_text_form
    from patched_engine.codemod import PatchError, patch_source

    host = inv.host_for(engine)
    located = locate(host, engine.python, engine.sglang_location, label=engine.label)
    try:
        original = host.read_file(located.path)
    except OSError as exc:
        raise EnvironmentProblem(f"{engine.label}: cannot read {located.path}: {exc}", path=located.path) from exc
    if remote_file.sha256(original) != located.file["sha256"]:
        raise EnvironmentProblem(f"{engine.label}: {located.path} changed while it was read; try again")
    version = located.version or inv.sglang
    release_sha = None
    reason = ""
    patch_id = patch_id_of(original)
    release: Release | None = None
    if version:
        if version not in release_cache:
            try:
                release_cache[version] = release_conn(version)
            except EnvironmentProblem as exc:
                release_cache[version] = exc
        cached = release_cache[version]
        if isinstance(cached, Release):
            release = cached
            release_sha = cached.sha256
    if patch_id is not None and patch_id != PATCH_ID:
        kind, reason = "fork", (f"carries a different patch, PD_FORENSICS_PATCH = {patch_id!r} (this deployer's is "
                                f"{PATCH_ID!r}): roll it back first")
    elif patch_id is not None:
        kind, reason = "patched", f"carries PD_FORENSICS_PATCH = {patch_id!r}"
    elif release is not None and release.conn_bytes == original:
        kind = "original"
        reason = f"byte-identical to nixl/conn.py of the sglang {version} wheel (sha256 {release_sha[:12]}…)"
    elif release is not None:
        kind = "fork"
        reason = (f"differs from nixl/conn.py of the sglang {version} wheel (sha256 {release_sha[:12]}…, "
                  f"this file {remote_file.sha256(original)[:12]}…): a fork or a local edit")
    else:
        kind = "fork"
        why = release_cache.get(version) if version else None
        reason = (f"cannot compare with a released file: release {'unknown' if not version else version}"
                  f"{f' ({why})' if why else ''}")
    plan = EnginePlan(
        engine=engine.name, label=engine.label, host=host.name, python=located.python, sudo=engine.sudo,
        restart=restart_argv(engine.restart) if engine.restart else None, located=located, original=original,
        kind=kind, release=version, release_sha256=release_sha, reason=reason, patch_id=patch_id,
    )
    if kind != "patched":
        try:
            stored, form = decode_source(original, located.path)
            result = patch_source(normalize_newlines(stored), version)  # diff paths relative to site-packages
            plan.patch = result
            plan.diff = result.diff
            if result.changed:
                plan.new_bytes = restore_text_form(stored, result.new_text, form).encode(form.encoding)
        except (PatchError, ApplyError, UnicodeEncodeError) as exc:
            plan.problem = f"the codemod refuses {located.path}: {exc}"
    if plan.problem is None and kind != "patched" and not engine.sudo:
        f = located.file
        if f["uid"] != located.raw.get("uid") or not f.get("dir_writable"):
            plan.problem = (f"{located.path} belongs to uid {f['uid']} (the login user is uid {located.raw.get('uid')}) "
                            "or its directory is not writable, and the host table says sudo = false: set "
                            "sudo = true and install the sudoers rules of docs/LIVE.md")
    return plan


def plan_deploy(source: Any) -> DeployPlan:
    """Read every prefill engine's file and plan the deploy. Writes nothing."""
    from patched_engine.decode_hazard import decode_hazards

    inv, path = _inventory(source)
    cache: dict[str, Release | Exception] = {}
    engines = [_plan_engine(inv, engine, release_cache=cache) for engine in inv.engines_with("prefill")]
    hazards, undecided = decode_hazards(inv)
    return DeployPlan(str(path) if path else None, inv.name, inv.is_twin, engines, hazards, undecided)


# ----------------------------------------------------------------------------- the record


@dataclass
class DeployRecord:
    """What a deploy or rollback did: the plan, each step, the liveness check, the outcome."""

    action: str  # deploy or rollback
    status: str  # planned, refused, deployed, already-patched, rolled-back, already-original, failed, not-live
    plan: DeployPlan
    steps: list[Step] = field(default_factory=list)
    liveness: dict[str, Any] | None = None
    message: str = ""
    problem: str | None = None

    @property
    def exit_status(self) -> ExitStatus:
        if self.status in ("planned", "deployed", "already-patched", "rolled-back", "already-original"):
            return GOOD
        if self.status == "failed":
            return ExitStatus.ENVIRONMENT
        return BAD  # refused, not-live

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "outcome": self.status, "message": self.message, "problem": self.problem,
                **self.plan.to_dict(), "steps": [s.to_dict() for s in self.steps], "liveness": self.liveness,
                "commands": self.plan.commands() if self.status == "planned" else None}

    def headline(self) -> str:
        return f"{self.action} {self.plan.deployment}: {self.status}" + (f" — {self.message}" if self.message else "")

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        style = {0: "green", 1: "red"}.get(int(self.exit_status), "yellow")
        parts: list[Any] = [Text(self.headline(), style=f"bold {style}")]
        for e in self.plan.engines:
            parts.append(Text(f"{e.label}: {e.path} ({e.kind}: {e.reason})"))
            if self.status in ("planned", "refused"):
                parts += [Text(f"  {i}. {a}") for i, a in enumerate(e.actions(), 1)]
        parts += [Text(f"warning: {w}", style="yellow") for w in self.plan.warnings()]
        if self.steps:
            table = Table("engine", "step", "state", "seconds", "detail")
            for s in self.steps:
                table.add_row(s.engine, s.name, s.state, f"{s.duration_s:.2f}", s.detail[:100])
            parts.append(table)
        if self.liveness is not None:
            parts.append(Text(f"liveness: {self.liveness.get('outcome')} after {self.liveness.get('waited_s')}s"))
        if self.problem:
            parts.append(Text(self.problem, style="red"))
        return Group(*parts)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(s.engine)}</td><td>{html.escape(s.name)}</td><td>{s.state}</td>"
                       f"<td>{s.duration_s:.2f}</td><td>{html.escape(s.detail[:200])}</td></tr>" for s in self.steps)
        warnings = "".join(f"<p style='color:#8a6d00'>warning: {html.escape(w)}</p>" for w in self.plan.warnings())
        return (f"<p><b>{html.escape(self.headline())}</b></p>{warnings}<table><tr><th>engine</th><th>step</th>"
                f"<th>state</th><th>s</th><th>detail</th></tr>{rows}</table>")


# ----------------------------------------------------------------------------- liveness


def wait_liveness(inv, deadline_s: float) -> dict[str, Any]:
    """Real one-token requests through the deployment until every liveness target answers 2xx, or the deadline."""
    from forensics.probes import probe_once

    started = time.monotonic()
    attempts = 0
    last: list[dict[str, Any]] = []
    while True:
        attempts += 1
        left = deadline_s - (time.monotonic() - started)
        cap = max(left, 2.0)
        results = probe_once(inv, kinds=("liveness",), deadline_s={"liveness": min(30.0, cap / 2)}, cap_s=cap,
                             wait=True)
        frame = results.frame
        rows = frame[frame["kind"] == "liveness"]
        last = [{"target": str(r.target), "outcome": str(r.outcome),
                 "status": None if r.status is None or str(r.status) == "<NA>" else int(r.status),
                 "total_s": None if r.total_s != r.total_s else round(float(r.total_s), 3),
                 "detail": str(r.detail)} for r in rows.itertuples()]
        ok = bool(last) and all(row["outcome"] == "ok" for row in last)
        waited = round(time.monotonic() - started, 3)
        if ok:
            return {"outcome": "ok", "waited_s": waited, "attempts": attempts, "probes": last}
        if time.monotonic() - started >= deadline_s:
            return {"outcome": "failed", "waited_s": waited, "attempts": attempts, "probes": last,
                    "deadline_s": deadline_s}
        time.sleep(min(1.0, max(deadline_s - (time.monotonic() - started), 0.0)))


# ----------------------------------------------------------------------------- deploy


def _locate_step(plan: EnginePlan) -> Step:
    """The plan's read of the engine (its interpreter's answer and the known-release check) as a step."""
    result = plan.located.result
    detail = (f"sglang {plan.release} ({plan.located.version_source or 'inventory'}) at {plan.located.package_dir}; "
              f"{plan.path}: {plan.kind} ({plan.reason})")
    return Step(plan.engine, "locate sglang with the engine's interpreter", "ok",
                duration_s=result.duration_s if result is not None else 0.0, detail=detail,
                commands=[_short_record(result)] if result is not None else [])


def _short_record(result) -> dict[str, Any]:
    record = result_record(result)
    record["argv"] = [record["argv"][0], "-c", f"<locate script, {len(record['argv'][2])} characters>",
                      *record["argv"][3:]]
    record["command_line"] = None
    return record


def _write_engine(rec: Recorder, plan: EnginePlan, data: bytes, *, backup: bool) -> None:
    """Upload ``data`` (and a backup of the original), compile it there, install it atomically."""
    tmpdir = remote_file.make_tmpdir(rec)
    try:
        stamp = _stamp()
        backup_path, record_path = plan.backup_paths(stamp)
        owner = plan.owner
        uploads = {}
        if backup:
            import json

            record = {"backup": backup_path.rsplit("/", 1)[1], "of": plan.path,
                      "link": plan.located.conn if plan.located.file.get("symlink") else None,
                      "sha256": plan.sha256_before, "size": len(plan.original), "uid": owner.uid, "gid": owner.gid,
                      "mode": f"{owner.mode:04o}", "pid": 0, "created": datetime.now(UTC).isoformat(),
                      "release": plan.release, "release_sha256": plan.release_sha256, "kind": plan.kind,
                      "by": "patched_engine.deploy"}
            uploads["record.json"] = (json.dumps(record, indent=1) + "\n").encode()
            uploads["backup"] = plan.original
        for name, content in uploads.items():
            remote_file.upload(rec, tmpdir, name, content)
        conn_tmp = remote_file.upload(rec, tmpdir, "conn.py", data)
        remote_file.kill_point("after-upload")
        with rec.step("compile check with the target interpreter") as step:
            rec.run(step, [plan.python, "-m", "py_compile", conn_tmp])
            step.detail = f"{plan.python} -m py_compile: ok"
        if backup:
            record_owner, backup_owner = plan.backup_owners()
            remote_file.install_atomically(rec, f"{tmpdir}/record.json", record_path, record_owner,
                                           uploads["record.json"])
            remote_file.install_atomically(rec, f"{tmpdir}/backup", backup_path, backup_owner, plan.original)
        with rec.step("check the file is still the one planned") as step:
            now = rec.host.read_file(plan.path)
            if now != plan.original:
                raise StepFailed(f"{plan.label}: {plan.path} changed since the plan (sha256 "
                                 f"{remote_file.sha256(now)[:12]}…); nothing written, plan again")
        remote_file.install_atomically(rec, conn_tmp, plan.path, owner, data, kill_points=True)
    finally:
        remote_file.remove_tmpdir(rec, tmpdir)


def _finish_engine(rec: Recorder, plan: EnginePlan, *, restart_timeout_s: float) -> None:
    with rec.step("remove the bytecode of conn.py") as step:
        found = list(plan.located.file.get("pycache") or [])
        for pyc in found:  # one file per command: a sudoers rule can name each exactly
            rec.run(step, ["rm", "-f", "--", pyc], sudo=rec.sudo)
        step.detail = f"{len(found)} file(s)" if found else "none found"
    if plan.restart:
        with rec.step("restart") as step:
            rec.run(step, plan.restart, timeout=restart_timeout_s)
            step.detail = shlex.join(plan.restart)
    else:
        rec.steps.append(Step(plan.engine, "restart", "skipped", detail="no restart line in the inventory"))


def _planned(action: str, inv, path, restart_decodes: bool) -> DeployRecord:
    plan = plan_deploy(inv)
    plan.inventory = str(path) if path else None
    plan.restart_decodes = restart_decodes
    return DeployRecord(action, "planned", plan)


def _restart_blocking_decodes(inv, plan: DeployPlan, record: DeployRecord, *, restart_timeout_s: float,
                              on_step: Callable[[Step], None] | None) -> None:
    """After the prefills' restart: restart each decode whose release blocks on the restarted
    prefill (a fresh decode has no cached socket to the old one)."""
    for hazard in plan.decode_hazards:
        engine = inv.engine_named(hazard.engine)
        rec = Recorder(inv.host_for(engine), hazard.engine, sudo=engine.sudo, steps=record.steps, on_step=on_step)
        if not hazard.restart:
            record.steps.append(Step(hazard.engine, "restart the decode", "skipped",
                                     detail="no restart line in the inventory: restart it yourself"))
            continue
        with rec.step("restart the decode") as step:
            rec.run(step, hazard.restart, timeout=restart_timeout_s)
            step.detail = f"{shlex.join(hazard.restart)} (its release blocks on a restarted prefill: {hazard.where})"


def _not_live(record: DeployRecord, text: str) -> str:
    """The not-live message, naming the decode hazard when it may be why (and was not dealt with)."""
    if record.plan.decode_hazards and not record.plan.restart_decodes:
        names = ", ".join(h.label for h in record.plan.decode_hazards)
        text += (f"; {names} may be blocked sending to the old prefill (sglang {record.plan.decode_hazards[0].release}"
                 f", {record.plan.decode_hazards[0].where}): restart the decode (--restart-decodes) before anything "
                 "else")
    return text


def deploy(source: Any, *, yes: bool = False, force: bool = False, restart: bool = False,
           restart_decodes: bool = False, liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S,
           restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
           on_step: Callable[[Step], None] | None = None) -> DeployRecord:
    """Plan, then (with ``yes=True``, or on a twin) write, restart and wait for liveness.

    ``force``: deploy over a file that is not the release's own (a fork), after its diff was
    shown. ``restart``: restart engines that are already patched too (after a deploy that
    was interrupted between the write and the restart). ``restart_decodes``: after the
    prefills, restart each decode whose release blocks on a send to a restarted prefill
    (sglang 0.5.15: :mod:`patched_engine.decode_hazard`; the plan warns of them either way).
    """
    remote_file.check_kill_env()
    inv, path = _inventory(source)
    try:
        record = _planned("deploy", inv, path, restart_decodes)
        plan = record.plan
        problems = [e for e in plan.engines if e.problem]
        if problems:
            record.status = "refused"
            record.message = "; ".join(f"{e.label}: {e.problem}" for e in problems)
            return record
        if plan.forks and not force:
            record.status = "refused"
            record.message = ("not the release's own file: " + "; ".join(f"{e.label}: {e.reason}" for e in plan.forks)
                              + ". Review the diff, then pass --force (force=True) to deploy it anyway")
            return record
        if not (yes or plan.twin):
            record.message = "plan only: pass --yes (yes=True) to deploy to this live deployment"
            return record
        todo = [e for e in plan.engines if e.needed or (restart and e.kind == "patched")]
        try:
            for e in plan.engines:
                rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo, steps=record.steps,
                               on_step=on_step)
                record.steps.append(_locate_step(e))
                if e.needed:
                    _write_engine(rec, e, e.new_bytes, backup=True)
                if e in todo:
                    _finish_engine(rec, e, restart_timeout_s=restart_timeout_s)
            if restart_decodes and any(e.restart for e in todo):
                _restart_blocking_decodes(inv, plan, record, restart_timeout_s=restart_timeout_s, on_step=on_step)
        except (StepFailed, EnvironmentProblem) as exc:
            record.status = "failed"
            record.problem = str(exc)
            return record
        record.liveness = wait_liveness(inv, liveness_deadline_s)
        wrote = [e for e in plan.engines if e.needed]
        if record.liveness["outcome"] != "ok":
            record.status = "not-live"
            record.message = _not_live(record,
                                       f"liveness failed {record.liveness['waited_s']}s after the restart: roll back "
                                       "with `forensics patch rollback --inventory FILE --yes`")
        elif wrote:
            record.status = "deployed"
            record.message = f"patched {len(wrote)} prefill engine(s); liveness ok"
        else:
            record.status = "already-patched"
            record.message = ("every prefill engine already carries the patch; liveness ok"
                              + ("" if todo else " (pass --restart if an earlier deploy stopped before its restart)"))
        return record
    finally:
        inv.close_hosts()


# ----------------------------------------------------------------------------- status


@dataclass
class EngineStatus:
    engine: str
    label: str
    state: str  # original, patched, unknown, unreadable
    file: str | None = None
    release: str | None = None
    patch_id: str | None = None
    sha256: str | None = None
    reason: str = ""
    backups: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class StatusReport:
    deployment: str
    engines: list[EngineStatus]

    @property
    def exit_status(self) -> ExitStatus:
        if any(e.state == "unreadable" for e in self.engines):
            return INCONCLUSIVE
        if self.engines and all(e.state == "patched" for e in self.engines):
            return GOOD
        return BAD

    @property
    def word(self) -> str:
        return {0: "patched", 1: "not-patched", 3: "inconclusive"}[int(self.exit_status)]

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "engines": [e.to_dict() for e in self.engines]}

    def __rich__(self):
        from rich.table import Table

        table = Table("engine", "state", "patch", "release", "file", "reason", title=f"{self.deployment}: {self.word}")
        for e in self.engines:
            table.add_row(e.label, e.state, e.patch_id or "", e.release or "", e.file or "", e.reason)
        return table


def status(source: Any) -> StatusReport:
    """Per prefill engine: original (the release's file), patched (which patch id), unknown, or unreadable."""
    inv, _ = _inventory(source)
    engines = []
    cache: dict[str, Release | Exception] = {}
    try:
        for engine in inv.engines_with("prefill"):
            try:
                plan = _plan_engine(inv, engine, release_cache=cache)
            except EnvironmentProblem as exc:
                engines.append(EngineStatus(engine.name, engine.label, "unreadable", reason=str(exc)))
                continue
            state = {"patched": "patched", "original": "original"}.get(plan.kind, "unknown")
            if plan.kind == "fork" and plan.release_sha256 is None:
                state = "unreadable"  # the release's file could not be had: undecided, not "unknown"
            engines.append(EngineStatus(
                engine.name, engine.label, state, file=plan.path, release=plan.release, patch_id=plan.patch_id,
                sha256=plan.sha256_before, reason=plan.reason,
                backups=[b["path"] for b in plan.located.file.get("backups", [])]))
    finally:
        inv.close_hosts()
    return StatusReport(inv.name, engines)


# ----------------------------------------------------------------------------- rollback


def _chosen_backup(plan: EnginePlan) -> dict[str, Any] | None:
    """The newest backup of this file whose record names it and whose sha256 matches the record."""
    good = [b for b in plan.located.file.get("backups", [])
            if b.get("recorded") and b["recorded"].get("sha256") == b["sha256"]
            and b["recorded"].get("of") == plan.path]
    return good[-1] if good else None


def rollback(source: Any, *, yes: bool = False, restart_decodes: bool = False,
             liveness_deadline_s: float = DEFAULT_LIVENESS_DEADLINE_S,
             restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
             on_step: Callable[[Step], None] | None = None) -> DeployRecord:
    """Put each prefill's newest verified backup back, byte for byte; restart; wait for liveness.

    ``restart_decodes`` as for :func:`deploy` (a rollback restarts the prefills too)."""
    remote_file.check_kill_env()
    inv, path = _inventory(source)
    try:
        record = _planned("rollback", inv, path, restart_decodes)
        plan = record.plan
        chosen: dict[str, dict[str, Any]] = {}
        missing = []
        for e in plan.engines:
            backup = _chosen_backup(e)
            if e.kind != "patched":
                continue  # the release's own file, or a fork nobody patched: nothing of ours to undo
            if backup is None:
                missing.append(f"{e.label}: {e.path} is patched but no backup with a matching record is beside it")
            else:
                chosen[e.engine] = backup
        if missing:
            record.status = "refused"
            record.message = "; ".join(missing)
            return record
        if not chosen:
            record.status = "already-original"
            record.message = "no prefill engine differs from its backup: nothing to roll back"
            return record
        if not (yes or plan.twin):
            record.message = ("plan only: would restore " + ", ".join(f"{b['path']} over {e.path}" for e in plan.engines
                                                                      if (b := chosen.get(e.engine)))
                              + "; pass --yes (yes=True)")
            return record
        try:
            for e in plan.engines:
                backup = chosen.get(e.engine)
                if backup is None:
                    continue
                rec = Recorder(inv.host_for(inv.engine_named(e.engine)), e.engine, sudo=e.sudo, steps=record.steps,
                               on_step=on_step)
                record.steps.append(_locate_step(e))
                with rec.step("read and check the backup") as step:
                    data = rec.host.read_file(backup["path"])
                    digest = remote_file.sha256(data)
                    if digest != backup["recorded"]["sha256"]:
                        raise StepFailed(f"{e.label}: {backup['path']} sha256 {digest[:12]}… is not the "
                                         f"{backup['recorded']['sha256'][:12]}… its record holds; nothing restored")
                    same = " (the release's own file)" if digest == e.release_sha256 else ""
                    step.detail = f"{backup['path']}: sha256 {digest[:12]}… as recorded{same}"
                _write_engine(rec, e, data, backup=False)
                _finish_engine(rec, e, restart_timeout_s=restart_timeout_s)
            if restart_decodes and any(e.restart for e in plan.engines if e.engine in chosen):
                _restart_blocking_decodes(inv, plan, record, restart_timeout_s=restart_timeout_s, on_step=on_step)
        except (StepFailed, EnvironmentProblem) as exc:
            record.status = "failed"
            record.problem = str(exc)
            return record
        record.liveness = wait_liveness(inv, liveness_deadline_s)
        if record.liveness["outcome"] != "ok":
            record.status = "not-live"
            record.message = _not_live(record,
                                       f"restored, but liveness failed {record.liveness['waited_s']}s after the restart")
        else:
            record.status = "rolled-back"
            record.message = f"restored {len(chosen)} prefill engine(s) from their backups; liveness ok"
        return record
    finally:
        inv.close_hosts()
