"""The dry-run plan for a real systemd deployment: the exact commands, from the sample inventory.

No GPU deployment is reachable here, so the live path is pinned by what it would run on
``docs/examples/pd-two-node.toml`` (systemctl, journalctl, py-spy, the interpreter, the
file paths, ``sudo -n`` where the host table asks for it), and docs/LIVE.md's sudoers
rules are checked to allow exactly those commands. A ``live`` test runs the read-only
commands against a real deployment when ``PD_FORENSICS_LIVE_INVENTORY`` names its inventory.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from pathlib import Path

import pytest

from patched_engine.live_plan import plan_commands, sudoers_rules
from patched_engine.locate import LOCATE_SCRIPT

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "docs/examples/pd-two-node.toml"
LIVE_DOC = ROOT / "docs/LIVE.md"
SITE = "/opt/sglang/.venv/lib/python3.11/site-packages"
NIXL = f"{SITE}/sglang/srt/disaggregation/nixl"
PY = "/opt/sglang/.venv/bin/python"
TMP = "/tmp/pd-forensics-deploy.XXXXXXXX"
SUDO = ["sudo", "-n", "--"]
RM_PYC = [[*SUDO, "rm", "-f", "--", f"{NIXL}/__pycache__/conn.cpython-311{opt}.pyc"] for opt in ("", ".opt-1", ".opt-2")]


def _lines(phase: str) -> list[tuple[str, str, list[str]]]:
    return [(c.engine, c.host, list(c.argv)) for c in plan_commands(SAMPLE, phases=(phase,))]


def test_collect_finds_processes_reads_environ_dumps_threads_and_journals_through_sudo():
    from forensics.collectors.processes import LOOKUP_SCRIPT as PROCESS_SCRIPT

    py_spy = "/opt/sglang/.venv/bin/py-spy"

    def journal(unit: str) -> list[str]:
        return [*SUDO, "journalctl", "-u", unit, "-o", "json", "--all", "--no-pager"]

    lines = _lines("collect")
    assert [(engine, host) for engine, host, _ in lines] == [
        ("prefill-0", "prefill-node")] * 4 + [("decode-0", "decode-node")] * 4 + [("router", "decode-node")] * 2
    argvs = [argv for _, _, argv in lines]
    assert [argv[:2] for argv in argvs[0::4][:2]] == [["python3", "-c"]] * 2  # the lookup never uses sudo
    assert argvs[1:4] == [[*SUDO, "cat", "/proc/PID/environ"], [*SUDO, py_spy, "dump", "--json", "--pid", "PID"],
                          journal("sglang-prefill.service")]
    assert argvs[5:8] == [[*SUDO, "cat", "/proc/PID/environ"], [*SUDO, py_spy, "dump", "--json", "--pid", "PID"],
                          journal("sglang-decode.service")]
    assert argvs[8][:2] == ["python3", "-c"] and argvs[9] == journal("sglang-router.service")
    assert {argv[2] for argv in (argvs[0], argvs[4], argvs[8])} == {PROCESS_SCRIPT}


def _write(source: str, dest: str, mode: str) -> list[list[str]]:
    directory, name = dest.rsplit("/", 1)
    temp = f"{directory}/.{name}.pd-forensics-deploy.tmp"
    return [[*SUDO, "install", "-o", "UID", "-g", "GID", "-m", mode, f"{TMP}/{source}", temp],
            [*SUDO, "rm", "-f", "--", temp],  # only when the install failed: its partial file
            ["sync"], [*SUDO, "mv", "-f", temp, dest], ["sync"]]


def _after_restart() -> list[list[str]]:
    """The file located again and the engine's processes' start times (never through sudo)."""
    from forensics.collectors.processes import LOOKUP_SCRIPT as PROCESS_SCRIPT
    from forensics.collectors.processes import ProcessSelector

    selector = ProcessSelector(title="sglang::scheduler", cmdline="--disaggregation-mode prefill")
    return [[PY, "-c", LOCATE_SCRIPT, SITE], [PY, "-c", PROCESS_SCRIPT, selector.script_argument()]]


def test_deploy_touches_only_the_prefill_with_its_interpreter_and_systemctl():
    lines = _lines("deploy")
    assert {(engine, host) for engine, host, _ in lines} == {("prefill-0", "prefill-node")}
    argvs = [argv for _, _, argv in lines]
    assert argvs == [
        [PY, "-c", LOCATE_SCRIPT, SITE],
        ["mktemp", "-d", TMP],
        [PY, "-m", "py_compile", f"{TMP}/conn.py"],
        *_write("record.json", f"{NIXL}/conn.py.pd-forensics-record-STAMP.json", "0644"),
        *_write("backup", f"{NIXL}/conn.py.pd-forensics-backup-STAMP", "MODE"),
        *_write("conn.py", f"{NIXL}/conn.py", "MODE"),
        ["rm", "-rf", "--", TMP],
        *RM_PYC,
        ["sudo", "-n", "systemctl", "restart", "sglang-prefill.service"],
        *_after_restart(),
    ]


def test_rollback_writes_the_backup_back_and_restarts():
    argvs = [argv for _, _, argv in _lines("rollback")]
    assert argvs == [
        [PY, "-c", LOCATE_SCRIPT, SITE],
        ["mktemp", "-d", TMP],
        [PY, "-m", "py_compile", f"{TMP}/conn.py"],
        *_write("conn.py", f"{NIXL}/conn.py", "MODE"),
        ["rm", "-rf", "--", TMP],
        *RM_PYC,
        ["sudo", "-n", "systemctl", "restart", "sglang-prefill.service"],
        *_after_restart(),
    ]


def test_the_locate_script_imports_nothing_of_sglang():
    assert "find_spec" in LOCATE_SCRIPT and "import sglang" not in LOCATE_SCRIPT
    compile(LOCATE_SCRIPT, "locate", "exec")


def _sudoers_block() -> str:
    block = re.search(r"```sudoers\n(.*?)```", LIVE_DOC.read_text(), re.S)
    assert block, "docs/LIVE.md has no ```sudoers block"
    return block.group(1)


def _rules(block: str) -> list[str]:
    """The command patterns of the block's Cmnd_Alias lines."""
    body = block.replace("\\\n", " ")
    patterns = []
    for line in body.splitlines():
        match = re.match(r"\s*Cmnd_Alias\s+\w+\s*=\s*(.*)", line)
        if match:
            patterns += [p.strip() for p in match.group(1).split(",") if p.strip()]
    return patterns


def _allowed(argv: list[str], patterns: list[str]) -> bool:
    # sudo matches the program by full path and the arguments as one string (glob rules).
    program, args = argv[0], " ".join(argv[1:])
    for pattern in patterns:
        want_program, _, want_args = pattern.partition(" ")
        if Path(want_program).name != Path(program).name and want_program != program:
            continue
        if fnmatch.fnmatchcase(args, want_args):
            return True
    return False


def test_the_runbook_sudoers_block_is_the_generated_one_and_allows_the_plan():
    block = _sudoers_block()
    assert block == sudoers_rules(SAMPLE, user="ops", uid=0, gid=0, mode="0644")
    patterns = _rules(block)
    assert patterns and not any("*" in p for p in patterns)  # no wildcard that could swallow more arguments
    planned = [list(c.argv) for c in plan_commands(SAMPLE)]
    needing_sudo = [argv[3:] if argv[:3] == SUDO else argv[2:] for argv in planned if argv[0] == "sudo"]
    checked = 0
    for argv in needing_sudo:
        if argv[:2] == ["python3", "-c"]:
            continue  # the process lookup: no exact rule can name a script (docs/LIVE.md says why)
        concrete = [a.replace("PID", "4242").replace("UID", "0").replace("GID", "0").replace("MODE", "0644")
                    .replace("STAMP", "20261130T000000000000Z").replace("XXXXXXXX", "a1B2c3D4") for a in argv]
        assert _allowed(concrete, patterns), f"docs/LIVE.md's sudoers rules do not allow: {shlex.join(concrete)}"
        checked += 1
    assert checked >= 10
    assert _allowed(["journalctl", "-u", "sglang-prefill.service", "-o", "json", "--all", "--no-pager", "--since",
                     "@1764547200.000000", "--until", "@1764547800.000000"], patterns)
    assert not _allowed(["rm", "-rf", "/"], patterns)
    assert not _allowed(["mv", "-f", "/tmp/x", "/etc/passwd"], patterns)
    assert not _allowed(["/opt/sglang/.venv/bin/py-spy", "dump", "--json", "--pid", "1", "--locals"], patterns)
    assert not _allowed(["systemctl", "restart", "sshd.service"], patterns)


def test_the_runbook_names_every_command_it_needs():
    text = LIVE_DOC.read_text()
    for word in ("py-spy", "journalctl", "systemctl restart", "forensics patch deploy", "forensics patch rollback",
                 "forensics patch status", "forensics collect", "forensics diagnose", "forensics validate",
                 "PD_FORENSICS_LIVE_INVENTORY", "--yes"):
        assert word in text, word


@pytest.mark.live
def test_live_deployment_status_answers():
    """Against a real deployment: the read-only status names every prefill engine's file."""
    from patched_engine.deploy import status

    report = status(os.environ["PD_FORENSICS_LIVE_INVENTORY"])
    assert report.engines
    assert all(e.state in ("original", "patched", "patched-not-running", "patched-unconfirmed", "unknown")
               for e in report.engines), report.to_dict()
