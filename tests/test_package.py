"""The package's promises: a light import, a working CLI entry point, exit codes."""

from __future__ import annotations

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
    out = subprocess.run([sys.executable, "-m", "forensics", "--help"], capture_output=True, text=True, check=True)
    assert "logs" in out.stdout


def test_unknown_subcommand_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "forensics", "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2
