"""The deploy's plan: each prefill engine located, its file checked against the release's wheel, patched in memory.

Nothing here writes. :func:`plan_deploy` asks each prefill engine's interpreter where its
sglang is (:mod:`patched_engine.locate`), reads ``nixl/conn.py``, names it by its bytes
(:mod:`patched_engine.baselines`: the wheel's file, in an engine environment its CPU-adapted
form, the fix on either; anything else is a fork), runs the codemod in memory and says what
the deploy would do (:meth:`EnginePlan.actions`) and run (:meth:`DeployPlan.commands`).
:func:`~patched_engine.baselines.accepted_baselines` is the one place that says which bytes
count as a release's own file (a rollback restores nothing else without ``force``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from forensics.exitcodes import EnvironmentProblem
from forensics.inventory.model import restart_argv
from patched_engine import remote_file
from patched_engine.baselines import (
    BASE_TEXT,
    Release,
    classify,
    engine_environment_root,
    is_cached_environment,
    patched_bytes,
    release_conn,
)
from patched_engine.locate import Located, locate, locate_argv
from patched_engine.remote_file import Owner
from patched_engine.running import EARLIER_FILE, NO_PROCESS
from patched_engine.snippets import PATCH_ID

SENTINEL_RE = re.compile(r'^PD_FORENSICS_PATCH\s*=\s*["\']([^"\']+)["\']', re.M)
PLACEHOLDER_TMPDIR = "/tmp/pd-forensics-deploy.XXXXXXXX"
PLACEHOLDER_STAMP = "STAMP"
# A backup and its record: their owner reads them, nobody else. Only without sudo: through
# sudo they are root's, and the operator reads them back (and a rollback reads the backup)
# without sudo, so there they keep the modes docs/LIVE.md's sudoers rules name.
BACKUP_MODE = 0o600


def load_inventory(source: Any):
    """(Inventory, its path or None) from an inventory, a twin or a path."""
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


def stamp() -> str:
    """The backup's time stamp: UTC to the microsecond (20 digits and a T, the sudoers rules' glob)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


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
    # "original" (the wheel's own file), "cpu-adapted" (the wheel's file with the CPU adaptation, in an
    # engine environment), "patched", "fork" (anything else, the adapted bytes outside an engine environment too)
    kind: str
    release: str | None
    release_sha256: str | None
    reason: str
    new_bytes: bytes = b""
    diff: str = ""
    patch: Any = None  # PatchResult
    patch_id: str | None = None
    problem: str | None = None  # the codemod refuses the file (a finding: exit 1)
    blocked: str | None = None  # its directory cannot be written (environment: exit 4), naming the path
    wheel: Release | None = None  # the release's own file, when it could be had
    running: Any = None  # patched_engine.running.RunningCheck for an engine already patched on disk
    base: str | None = None  # for a patched file: "original" or "cpu-adapted" (None: neither, by its bytes)
    local: bool = False  # the engine runs on this machine (only there can a file be in an engine environment)

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
    def resumes_restart(self) -> bool:
        """Patched on disk, but the engine does not run it yet (a deploy stopped before its restart)."""
        return (self.kind == "patched" and bool(self.restart) and self.running is not None
                and self.running.verdict in (EARLIER_FILE, NO_PROCESS))

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
        if self.blocked and self.kind != "patched":
            return [f"cannot write: {self.blocked}"]
        if self.kind == "patched":
            done = [f"nothing to write: {self.path} already carries {self.patch_id}"]
            if self.resumes_restart:
                done.append(f"resume with the restart ({shlex.join(self.restart)}): {self.running.reason}")
            return done
        backup, record = self.backup_paths()
        who = "through sudo -n" if self.sudo else "as the login user (sudo = false)"
        owner = self.owner
        steps = [
            f"the bootstrap loop runs on this prefill engine ({self.label}); its file is {self.path}",
            f"compile the patched file with {self.python} (-m py_compile, in a private temporary directory)",
            f"back up {BASE_TEXT.get(self.kind, 'the file')} (sha256 {self.sha256_before[:12]}…) to {backup}, its "
            f"record in {record}",
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
            "release_sha256": self.release_sha256, "sha256": self.sha256_before, "kind": self.kind, "base": self.base,
            "reason": self.reason, "patch_id": self.patch_id, "problem": self.problem, "blocked": self.blocked,
            "needed": self.needed, "running": self.running.to_dict() if self.running is not None else None,
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
    # Why the deploy restarts them without being asked (a deployment of ours running real sglang), or None.
    restart_decodes_why: str | None = None

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
            elif e.resumes_restart:
                steps += e.finish_commands()
            out += [{"engine": e.engine, "host": e.host, "argv": argv} for argv in steps]
        if self.restart_decodes:
            out += [{"engine": h.engine, "host": h.host, "argv": h.restart} for h in self.decode_hazards if h.restart]
        return out

    def warnings(self) -> list[str]:
        """What the plan's reader must know before a restart: decodes that may block, or may not be known."""
        remedy = (f"; the deploy restarts it after the prefill{self._restart_why()}" if self.restart_decodes else
                  "; pass --restart-decodes (restart_decodes=True) to restart it after the prefill, or stop its "
                  "traffic and let its waiting requests time out (SGLANG_DISAGGREGATION_WAITING_TIMEOUT) first")
        return [h.describe() + remedy for h in self.decode_hazards] + self.decode_undecided

    def _restart_why(self) -> str:
        if not self.restart_decodes_why:
            return ""
        return (f" (as --restart-decodes does, unasked: {self.restart_decodes_why}; --no-restart-decodes leaves "
                "it running)")

    def to_dict(self) -> dict[str, Any]:
        return {"inventory": self.inventory, "deployment": self.deployment, "twin": self.twin,
                "engines": [e.to_dict() for e in self.engines],
                "decode_hazards": [h.to_dict() for h in self.decode_hazards],
                "decode_undecided": self.decode_undecided, "restart_decodes": self.restart_decodes,
                "restart_decodes_why": self.restart_decodes_why}


def plan_engine(inv, engine, *, release_cache: dict[str, Release | Exception], codemod: bool = True) -> EnginePlan:
    """Locate ``engine``'s file, name it by its bytes, and (``codemod``) patch it in memory.

    ``patch status`` asks without ``codemod``: what a file is needs no patched copy of it."""
    from patched_engine.apply import ApplyError
    from patched_engine.codemod import PatchError

    host = inv.host_for(engine)
    local = getattr(engine.host, "kind", None) == "local"
    located = locate(host, engine.python, engine.sglang_location, label=engine.label)
    try:
        original = host.read_file(located.path)
    except OSError as exc:
        raise EnvironmentProblem(f"{engine.label}: cannot read {located.path}: {exc}", path=located.path) from exc
    if remote_file.sha256(original) != located.file["sha256"]:
        raise EnvironmentProblem(f"{engine.label}: {located.path} changed while it was read; try again")
    version = located.version or inv.sglang
    release_sha = None
    base = None
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
    elif release is not None:
        found = classify(original, release, path=located.path, local=local, marked=patch_id is not None)
        kind, base, reason = found.kind, found.base, found.reason
        if kind == "patched":
            reason = f"carries PD_FORENSICS_PATCH = {patch_id!r}: {reason}"
    elif patch_id is not None:
        kind, reason = "patched", (f"carries PD_FORENSICS_PATCH = {patch_id!r}; on which file cannot be told: "
                                   f"release {version or 'unknown'}'s own file cannot be had")
    else:
        kind = "fork"
        why = release_cache.get(version) if version else None
        reason = (f"cannot compare with a released file: release {'unknown' if not version else version}"
                  f"{f' ({why})' if why else ''}")
    plan = EnginePlan(
        engine=engine.name, label=engine.label, host=host.name, python=located.python, sudo=engine.sudo,
        restart=restart_argv(engine.restart) if engine.restart else None, located=located, original=original,
        kind=kind, release=version, release_sha256=release_sha, reason=reason, patch_id=patch_id, wheel=release,
        base=base, local=local,
    )
    if kind != "patched" and codemod:
        try:
            if kind in ("original", "cpu-adapted") and release is not None:  # the same bytes, patched once
                plan.new_bytes, plan.patch = release.fix_on_original if kind == "original" else release.fix_on_adapted
            if plan.patch is None:
                plan.new_bytes, plan.patch = patched_bytes(original, version, located.path)
            plan.diff = plan.patch.diff
        except (PatchError, ApplyError, UnicodeEncodeError) as exc:
            plan.problem = f"the codemod refuses {located.path}: {exc}"
    plan.blocked = write_access_problem(located, sudo=engine.sudo) or (
        pristine_environment_problem(located.path) if local else None)
    return plan


def pristine_environment_problem(path: str) -> str | None:
    """Why the deploy must not write ``path``: it lies in a release's cached engine environment,
    which every deployment of that release clones and which stays pristine (docs/engine.md)."""
    root = engine_environment_root(path)
    if root is None or not is_cached_environment(root):
        return None
    return (f"{path} lies in the cached engine environment {root}, which every deployment of its release clones "
            "and which stays pristine: deploy to a deployment's own clone (`forensics twin up --engine sglang` "
            "makes one under <cache>/engine/deployments/)")


def write_access_problem(located: Located, *, sudo: bool) -> str | None:
    """Why the deploy cannot write beside ``located``'s file, naming the path; None when it can.

    "set sudo = true" is said only when it would help: sudo is off, the login user is not
    root, and the directory is neither on a read-only file system nor immutable (where
    root cannot write either)."""
    f = located.file or {}
    path = located.path
    directory = path.rsplit("/", 1)[0]
    if f.get("dir_readonly_fs"):
        return (f"{directory} is on a read-only file system: nobody can write {path} there, root included "
                "(remount it read-write, or patch the image it comes from)")
    if f.get("dir_immutable"):
        return (f"{directory} is immutable or append-only (chattr +i/+a): nobody can replace {path} there, root "
                "included (lsattr -d shows it; chattr -i/-a it first)")
    if sudo:
        return None
    uid = located.raw.get("uid")
    if f.get("dir_writable") and (uid == 0 or f.get("uid") == uid):
        return None
    why = (f"{directory} is not writable by the login user (uid {uid})" if not f.get("dir_writable") else
           f"{path} belongs to uid {f.get('uid')}, not to the login user (uid {uid}), whose install cannot keep "
           "its owner")
    if uid == 0:
        return f"{why}; the login user is root already, so sudo would not help"
    return (f"{why}, and the host table says sudo = false: set sudo = true and install the sudoers rules of "
            "docs/LIVE.md")


def plan_deploy(source: Any) -> DeployPlan:
    """Read every prefill engine's file and plan the deploy. Writes nothing.

    For an engine already patched on disk it also asks whether the running engine loaded
    that file (:func:`patched_engine.running.check_running`): a deploy that stopped between
    its write and its restart is resumed with the restart."""
    from patched_engine.decode_hazard import decode_hazards
    from patched_engine.running import check_running

    inv, path = load_inventory(source)
    cache: dict[str, Release | Exception] = {}
    engines = [plan_engine(inv, engine, release_cache=cache) for engine in inv.engines_with("prefill")]
    for e in engines:
        if e.kind == "patched":
            e.running = check_running(inv, inv.engine_named(e.engine), e.located)
    hazards, undecided = decode_hazards(inv)
    plan = DeployPlan(str(path) if path else None, inv.name, inv.is_twin, engines, hazards, undecided)
    plan.restart_decodes_why = real_engine_decodes(inv, hazards)
    return plan


def real_engine_decodes(inv, hazards) -> str | None:
    """Why the deploy restarts the blocking decodes unasked, or None (then only --restart-decodes does).

    A decode's restart is opt-in on a live deployment (it drops the decode's running requests).
    On a deployment of ours running real sglang it is what every deploy needs: the decode is
    sglang's own code, whose release blocks for good on a send to the restarted prefill
    (:mod:`patched_engine.decode_hazard` reads that from the release), and nobody else's traffic
    runs there. Ours: the inventory says so (``[twin] engine = "sglang"``, written by ``forensics
    twin up --engine sglang``), or each such decode's sglang lies in an engine environment of this
    machine's cache (:func:`~patched_engine.baselines.engine_environment_root`)."""
    if not hazards:
        return None
    labels = ", ".join(h.label for h in hazards)
    if (inv.twin or {}).get("engine") == "sglang":
        return (f"{labels} is real sglang {hazards[0].release}, started by `forensics twin up --engine sglang` "
                "([twin] engine = \"sglang\")")
    roots = []
    for hazard in hazards:
        engine = inv.engine_named(hazard.engine)
        root = (engine_environment_root(engine.sglang_location)
                if getattr(engine.host, "kind", None) == "local" and engine.sglang_location else None)
        if root is None:
            return None
        roots.append(str(root))
    return (f"{labels} is real sglang {hazards[0].release} from this machine's engine environment "
            f"({', '.join(sorted(set(roots)))}), a deployment of ours")

