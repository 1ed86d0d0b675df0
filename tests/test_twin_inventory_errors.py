"""The inventory reader names the file and the key for every error; --waiting-timeout is checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tomli_w

from forensics.inventory.twin_table import TwinSettings
from forensics.twin import api, inventory

FORENSICS = [sys.executable, "-m", "forensics"]


def _twin_doc(tmp_path) -> dict:
    settings = TwinSettings(directory=str(tmp_path), sglang="0.5.16", sglang_root=str(tmp_path / "site-packages"),
                            router_port=30000, prefill_port=30001, bootstrap_port=30002, decode_port=30003)
    return api.build_inventory(settings, tmp_path / "inventory.toml").to_dict()


def _write(tmp_path, doc: dict):
    path = tmp_path / "inventory.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def test_a_good_twin_inventory_loads(tmp_path):
    inv = inventory.load(_write(tmp_path, _twin_doc(tmp_path)))
    assert inv.is_twin and TwinSettings.from_dict(inv.twin).router_port == 30000


def test_non_utf8_bytes_name_the_file_and_offset(tmp_path):
    path = tmp_path / "inventory.toml"
    path.write_bytes(b'[deployment]\nname = "caf\xe9"\n')
    with pytest.raises(inventory.InventoryError) as caught:
        inventory.load(path)
    assert str(caught.value) == f"{path}: not UTF-8 text (byte 0xe9 at offset 24, line 2)"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("directory", None, "twin.directory: missing (required)"),
    ("sglang_root", None, "twin.sglang_root: missing (required)"),
    ("prefill_port", "30001", "twin.prefill_port: expected int, got str '30001'"),
    ("decode_port", True, "twin.decode_port: expected int, got bool True"),
    ("router_port", 70000, "twin.router_port: 70000 is not a TCP port"),
    ("patched", "yes", "twin.patched: expected bool, got str 'yes'"),
    ("waiting_timeout_s", "30", "twin.waiting_timeout_s: expected number, got str '30'"),
    ("waiting_timeout_s", float("nan"), "twin.waiting_timeout_s: expected a finite number, got nan"),
])
def test_twin_table_errors_name_file_and_key(tmp_path, key, value, message):
    doc = _twin_doc(tmp_path)
    if value is None:
        del doc["twin"][key]
    else:
        doc["twin"][key] = value
    path = _write(tmp_path, doc)
    with pytest.raises(inventory.InventoryError) as caught:
        inventory.load(path)
    # The line is the key's own, or the [twin] header's for a missing key.
    lines = path.read_text().splitlines()
    wanted = f"{key} = " if value is not None else "[twin]"
    line = next(i for i, text in enumerate(lines, 1) if text.startswith(wanted) and i > lines.index("[twin]"))
    assert str(caught.value) == f"{path}:{line}: {message}"


def test_engine_errors_name_file_and_key(tmp_path):
    doc = _twin_doc(tmp_path)
    doc["engine"][0]["bootstrap_port"] = "x"
    path = _write(tmp_path, doc)
    with pytest.raises(inventory.InventoryError, match=r"engine\[0\]\.bootstrap_port: expected int, got str"):
        inventory.load(path)


@pytest.mark.parametrize("command", ["status", "down", "restart"])
def test_cli_reports_a_bad_inventory_in_one_line(tmp_path, command):
    path = tmp_path / "inventory.toml"
    path.write_bytes(b'[deployment]\nname = "\xff"\n')
    result = subprocess.run([*FORENSICS, "twin", command, "--inventory", str(path), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 4, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1 and str(path) in result.stderr and "not UTF-8" in result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert (doc["exit"], doc["kind"]) == (4, "InventoryError")


@pytest.mark.parametrize("value", ["-1", "nan", "0", "inf", "-inf"])
def test_waiting_timeout_must_be_positive_and_finite(tmp_path, value):
    result = subprocess.run([*FORENSICS, "twin", "up", f"--waiting-timeout={value}", "--dir", str(tmp_path / "t")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--waiting-timeout" in result.stderr and "positive number of seconds" in result.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("value", [-1.0, float("nan"), 0.0])
def test_python_waiting_timeout_is_a_usage_problem(tmp_path, value):
    from forensics.exitcodes import UsageProblem

    with pytest.raises(UsageProblem, match="positive number of seconds"):
        api.up("0.5.16", waiting_timeout=value, directory=tmp_path / "t")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("name", ["twin dir", "it's $(touch pwned); {role}", "ünïcode\tand\nnewline"])
def test_the_restart_line_quotes_its_paths(tmp_path, name):
    import shlex
    import sys

    from forensics.inventory.twin_table import TwinSettings
    from forensics.twin.api import build_inventory

    directory = tmp_path / name
    inventory_path = directory / "inventory.toml"
    settings = TwinSettings(directory=str(directory), sglang="0.5.15", sglang_root=str(directory / "site-packages"))
    built = build_inventory(settings, inventory_path)
    for engine in built.engines:
        assert shlex.split(engine.restart) == [sys.executable, "-m", "forensics", "twin", "restart", engine.role,
                                               "--inventory", str(inventory_path)]


def test_a_device_a_pipe_and_a_huge_file_are_refused_naming_the_file(tmp_path):
    import os

    fifo = tmp_path / "inventory.fifo"
    os.mkfifo(fifo)  # opening it for a blocking read would wait for a writer forever
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# " + b"x" * (1024 * 1024) + b"\n")
    for path, why in (("/dev/zero", "not a regular file (a character device)"),
                      (fifo, "not a regular file (a named pipe)"),
                      (huge, "larger than 1 MiB, too big for an inventory file")):
        with pytest.raises(inventory.InventoryError) as caught:
            inventory.load(path)
        assert str(caught.value).startswith(f"{path}: {why}"), caught.value


@pytest.mark.parametrize("command", [["collect", "--out", "OUT"], ["diagnose"], ["twin", "status"]])
def test_cli_refuses_dev_zero_as_an_inventory_in_one_line(tmp_path, command):
    args = [str(tmp_path / "out") if part == "OUT" else part for part in command]
    result = subprocess.run([*FORENSICS, *args, "--inventory", "/dev/zero", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "/dev/zero: not a regular file" in result.stderr and "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert (doc["exit"], doc["kind"]) == (4, "InventoryError")
