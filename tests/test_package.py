"""The package's promises: a light import, a working CLI entry point, exit codes."""

from __future__ import annotations

import re
import subprocess
import sys


def test_import_forensics_stays_light():
    code = (
        "import sys, forensics\n"
        "heavy = [m for m in ('matplotlib', 'libcst', 'nixl_cu12', 'aiohttp', 'zmq', 'pandas', 'forensics.twin')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_cli_help_lists_subcommands():
    from forensics.cli import SUBCOMMANDS

    out = subprocess.run([sys.executable, "-m", "forensics", "--help"], capture_output=True, text=True, check=True)
    section = out.stdout.split("\nCommands:\n", 1)[1]
    listed = dict(re.findall(r"^  (\S+) +(.+)$", section, re.M))
    # Every registered sub-command, with its summary (a module that fails to be found drops out of --help).
    assert listed == {name: summary for name, (_, summary) in SUBCOMMANDS.items()}
    assert {"logs", "handlers", "patch", "twin", "demo"} <= set(listed)


def test_unknown_subcommand_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "forensics", "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "No such command 'no-such-command'" in out.stderr and out.stdout == ""
