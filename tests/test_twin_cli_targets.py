"""``twin status|restart|down`` take the deployment as ``twin up`` printed it: its directory or its
inventory file, positionally or as ``--inventory``; ``twin up`` prints the command that ends it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.server]
FORENSICS = [sys.executable, "-m", "forensics"]


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*FORENSICS, *args], capture_output=True, text=True, timeout=timeout)


def test_a_twin_is_ended_by_the_command_up_printed_and_named_by_its_directory(tmp_path):
    directory = tmp_path / "twin"
    up = _cli("twin", "up", "--dir", str(directory), "--json")
    assert up.returncode == 0, up.stderr
    doc = json.loads(up.stdout)
    try:
        assert doc["down_command"] == f"forensics twin down {doc['inventory']}"
        status = _cli("twin", "status", str(directory), "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["healthy"], status.stdout
        restart = _cli("twin", "restart", "router", doc["inventory"], "--json")
        assert restart.returncode == 0, restart.stderr
        both = _cli("twin", "status", str(directory), "--inventory", str(tmp_path / "other.toml"))
        assert both.returncode == 2 and "two deployments given" in both.stderr
    finally:
        down = _cli(*doc["down_command"].split()[1:], "--json")  # as printed, minus the program name
    assert down.returncode == 0, down.stdout + down.stderr
    assert sorted(json.loads(down.stdout)["stopped"]) == ["decode", "prefill", "router"]


def test_no_deployment_named_is_a_usage_error_that_says_what_to_give():
    result = _cli("twin", "down")
    assert result.returncode == 2
    assert "give its inventory file or its directory" in result.stderr


def test_up_in_a_terminal_prints_the_command_that_ends_it(tmp_path):
    directory = tmp_path / "twin"
    up = _cli("twin", "up", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        assert f"it runs until: forensics twin down {directory / 'inventory.toml'}" in up.stdout
    finally:
        _cli("twin", "down", str(directory))
