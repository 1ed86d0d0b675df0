"""The dry-run plan: every command collect, deploy and rollback would run on a live deployment.

    from patched_engine.live_plan import plan_commands
    for c in plan_commands("docs/examples/pd-two-node.toml"):
        print(c.phase, c.engine, c.host, c.line())

Nothing runs and no host is contacted: the commands come from the inventory alone, with
the values only the host can tell written as placeholders (``PID``, ``UID``, ``GID``,
``MODE``, ``STAMP``, the ``mktemp`` directory ``/tmp/pd-forensics-deploy.XXXXXXXX``). The
``sudo -n --`` prefix is shown where the host table says ``sudo = true``, as the Host would
add it. docs/LIVE.md derives its sudoers rules from these commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from patched_engine import remote_file
from patched_engine.deploy_plan import PLACEHOLDER_STAMP, PLACEHOLDER_TMPDIR, load_inventory, restart_argv
from patched_engine.locate import locate_argv

SUDO = ("sudo", "-n", "--")
PLACEHOLDER_PID = "PID"


@dataclass(frozen=True)
class PlannedCommand:
    phase: str  # collect, deploy, rollback
    engine: str
    host: str  # the engine's host reference as the inventory names it
    argv: tuple[str, ...]
    why: str

    def line(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "engine": self.engine, "host": self.host, "argv": list(self.argv),
                "why": self.why}


def conn_path(engine) -> str:
    if engine.sglang_location:
        return f"{engine.sglang_location.rstrip('/')}/sglang/srt/disaggregation/nixl/conn.py"
    return "SGLANG_PACKAGE_DIR/srt/disaggregation/nixl/conn.py"


def cache_tag(engine) -> str:
    """``cpython-311`` from ``.../lib/python3.11/site-packages``; ``CACHE_TAG`` when the path does not say."""
    match = re.search(r"/python(\d)\.(\d+)/", (engine.sglang_location or "") + "/")
    return f"cpython-{match[1]}{match[2]}" if match else "CACHE_TAG"


def pycache_files(engine) -> list[str]:
    directory = conn_path(engine).rsplit("/", 1)[0]
    tag = cache_tag(engine)
    return [f"{directory}/__pycache__/conn.{tag}{opt}.pyc" for opt in ("", ".opt-1", ".opt-2")]


def _collect(engine, host: str) -> list[PlannedCommand]:
    """What ``forensics collect`` runs on the engine's host (forensics.collection.engine_pieces)."""
    from forensics.collectors.processes import LOOKUP_SCRIPT as PROCESS_SCRIPT
    from forensics.collectors.processes import ProcessSelector
    from forensics.logs.remote import journalctl_argv
    from forensics.threads.dump import py_spy_argv

    sudo = SUDO if engine.sudo else ()
    out = []
    chosen = engine.selector
    if chosen is not None:
        selector = ProcessSelector(title=chosen.title, cmdline=chosen.cmdline, pid_file=chosen.pid_file)
        out.append(PlannedCommand("collect", engine.name, host,
                                  ("python3", "-c", PROCESS_SCRIPT, selector.script_argument()),
                                  "find the engine's processes (/proc: pid, start time, title, command line; "
                                  "never through sudo)"))
    if engine.role in ("prefill", "decode"):
        out.append(PlannedCommand("collect", engine.name, host, (*sudo, "cat", f"/proc/{PLACEHOLDER_PID}/environ"),
                                  "the engine's settings from its environment (secrets redacted before storing)"))
        argv = py_spy_argv(engine.py_spy, 0)
        argv[-1] = PLACEHOLDER_PID
        out.append(PlannedCommand("collect", engine.name, host, (*sudo, *argv),
                                  "thread dump of each process found (is bootstrap_thread alive?)"))
    log = engine.log_source
    if log is not None and log.kind in ("unit", "journal_file", "journal_dir"):
        argv = journalctl_argv(log.kind, log.value, unit=getattr(log, "unit", None), journalctl=engine.journalctl)
        out.append(PlannedCommand("collect", engine.name, host, (*sudo, *argv),
                                  "the engine's log (JSON, every field whole) for signatures and timestamps"))
    return out


def _write(engine, host: str, phase: str, source: str, dest: str, mode: str) -> list[PlannedCommand]:
    sudo = SUDO if engine.sudo else ()
    temp = remote_file.temp_name(dest)
    tmp = f"{PLACEHOLDER_TMPDIR}/{source}"
    return [
        PlannedCommand(phase, engine.name, host, (*sudo, "install", "-o", "UID", "-g", "GID", "-m", mode, tmp, temp),
                       f"{source} (uploaded by SFTP) beside {dest}, with the original's owner, group and mode"),
        PlannedCommand(phase, engine.name, host, (*sudo, "rm", "-f", "--", temp),
                       "only when that install failed (a full disk): remove the partial file it left"),
        PlannedCommand(phase, engine.name, host, ("sync",), "flush it to disk"),
        PlannedCommand(phase, engine.name, host, (*sudo, "mv", "-f", temp, dest), "the atomic rename"),
        PlannedCommand(phase, engine.name, host, ("sync",), "flush the directory entry"),
    ]


def _deploy(engine, host: str, phase: str) -> list[PlannedCommand]:
    sudo = SUDO if engine.sudo else ()
    conn = conn_path(engine)
    python = engine.python or "python3"
    backup = f"{conn}.pd-forensics-backup-{PLACEHOLDER_STAMP}"
    record = f"{conn}.pd-forensics-record-{PLACEHOLDER_STAMP}.json"
    out = [
        PlannedCommand(phase, engine.name, host, tuple(locate_argv(python, engine.sglang_location)),
                       "ask the engine's interpreter where sglang is, its release (importlib.metadata) and "
                       "nixl/conn.py's owner, mode and sha256 (imports nothing)"),
        PlannedCommand(phase, engine.name, host, ("mktemp", "-d", remote_file.TMPDIR_TEMPLATE),
                       "a private directory for the uploads"),
    ]
    if phase == "deploy":
        out.append(PlannedCommand(phase, engine.name, host, (python, "-m", "py_compile", f"{PLACEHOLDER_TMPDIR}/conn.py"),
                                  "compile the patched file with the engine's interpreter"))
        out += _write(engine, host, phase, "record.json", record, "0644")
        out += _write(engine, host, phase, "backup", backup, "MODE")
    else:
        out.append(PlannedCommand(phase, engine.name, host, (python, "-m", "py_compile", f"{PLACEHOLDER_TMPDIR}/conn.py"),
                                  "compile the backup's bytes (read and sha256-checked first) with the interpreter"))
    out += _write(engine, host, phase, "conn.py", conn, "MODE")
    out.append(PlannedCommand(phase, engine.name, host, ("rm", "-rf", "--", PLACEHOLDER_TMPDIR),
                              "remove the private directory"))
    for pyc in pycache_files(engine):
        out.append(PlannedCommand(phase, engine.name, host, (*sudo, "rm", "-f", "--", pyc),
                                  "remove conn.py's bytecode, one file per command (only those that exist)"))
    if engine.restart:
        out.append(PlannedCommand(phase, engine.name, host, tuple(restart_argv(engine.restart)),
                                  "restart the prefill (the inventory's restart line), then wait for LIVENESS"))
    out.append(PlannedCommand(phase, engine.name, host, tuple(locate_argv(python, engine.sglang_location)),
                              "after the restart: the file's change time again"))
    chosen = engine.selector
    if chosen is not None:
        from forensics.collectors.processes import LOOKUP_SCRIPT as PROCESS_SCRIPT
        from forensics.collectors.processes import ProcessSelector

        selector = ProcessSelector(title=chosen.title, cmdline=chosen.cmdline, pid_file=chosen.pid_file)
        out.append(PlannedCommand(phase, engine.name, host, (python, "-c", PROCESS_SCRIPT, selector.script_argument()),
                                  "the engine's processes' start times: each must have started after the file "
                                  "changed, or the engine still runs the old file (never through sudo)"))
    return out


def plan_commands(source: Any, phases: tuple[str, ...] = ("collect", "deploy", "rollback")) -> list[PlannedCommand]:
    """Every command the phases would run, from the inventory alone (nothing runs, no host is reached)."""
    inv, _ = load_inventory(source)
    out: list[PlannedCommand] = []
    for phase in phases:
        for engine in inv.engines:
            host = engine.host.ref
            if phase == "collect":
                out += _collect(engine, host)
            elif engine.role == "prefill":
                out += _deploy(engine, host, phase)
    return out


# ----------------------------------------------------------------------------- sudoers

STAMP_GLOB = "[0-9]" * 8 + "T" + "[0-9]" * 12 + "Z"  # the backup stamp: %Y%m%dT%H%M%S%fZ
TMPDIR_GLOB = "/tmp/pd-forensics-deploy." + "[A-Za-z0-9]" * 8  # what mktemp -d makes of XXXXXXXX
PROGRAMS = {"install": "/usr/bin/install", "mv": "/usr/bin/mv", "rm": "/usr/bin/rm",
            "systemctl": "/usr/bin/systemctl", "journalctl": "/usr/bin/journalctl"}


def _full(program: str) -> str:
    return program if program.startswith("/") else PROGRAMS.get(program, f"/usr/bin/{program}")


def engine_journalctl(inv, name: str) -> str:
    return inv.engine_named(name).journalctl


def sudoers_rules(source: Any, *, user: str = "ops", uid: int = 0, gid: int = 0, mode: str = "0644") -> str:
    """The sudoers file (one per node) allowing exactly the commands of :func:`plan_commands`.

    ``uid``/``gid``/``mode``: the owner and mode of ``nixl/conn.py`` on the node (``stat -c
    '%u %g %a'``), written into the rules so that nothing else can be chosen.
    """
    inv, _ = load_inventory(source)
    lines = ["# /etc/sudoers.d/pd-forensics (install with: visudo -cf FILE && install -m 0440 FILE /etc/sudoers.d/)",
             f"# generated for {inv.name}; owner {uid}:{gid}, mode {mode} of nixl/conn.py"]
    aliases: list[tuple[str, list[str]]] = []
    for node in sorted({e.host.ref for e in inv.engines if e.sudo or e.restart}):
        rules: list[str] = []
        for c in plan_commands(inv):
            if c.host != node or c.argv[0] != "sudo" or c.argv[3:5] == ("python3", "-c"):
                continue  # the process lookup script cannot be named exactly in sudoers: see docs/LIVE.md
            argv = list(c.argv[3:] if c.argv[:3] == SUDO else c.argv[2:])
            text = " ".join([_full(argv[0]), *argv[1:]])
            text = (text.replace("-o UID -g GID -m MODE", f"-o {uid} -g {gid} -m {mode}")
                    .replace("-o UID -g GID -m 0644", f"-o {uid} -g {gid} -m 0644")
                    .replace(PLACEHOLDER_TMPDIR, TMPDIR_GLOB).replace(PLACEHOLDER_STAMP, STAMP_GLOB))
            variants = [text]
            if argv[0] == engine_journalctl(inv, c.engine):
                bound = "@" + "[0-9]" * 10 + "." + "[0-9]" * 6  # forensics.logs.remote.journal_bound
                variants = [text, f"{text} --since {bound}", f"{text} --since {bound} --until {bound}"]
            if "/proc/PID/" in text:
                variants = [text.replace("PID", "[1-9]" + "[0-9]" * n) for n in range(7)]
            if text.endswith(" PID"):  # pids of 1 to 7 digits, no wildcard that could match more arguments
                variants = [text[:-3] + "[1-9]" + "[0-9]" * n for n in range(7)]
            rules += [v for v in variants if v not in rules]
        if rules:
            name = re.sub(r"[^A-Z0-9]", "_", f"PDFX_{node}".upper())
            aliases.append((name, rules))
    for name, rules in aliases:
        lines.append(f"Cmnd_Alias {name} = \\\n    " + ", \\\n    ".join(rules))
    if aliases:
        lines.append(f"{user} ALL=(root) NOPASSWD: " + ", ".join(name for name, _ in aliases))
    return "\n".join(lines) + "\n"
