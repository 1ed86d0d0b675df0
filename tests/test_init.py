"""``forensics init``: a starting inventory from what the on-call engineer knows, checked for real.

The checks run against a real twin (its URLs, its machine) and a real OpenSSH server on
127.0.0.1 (the ``sshd`` fixture), never against fakes: a host reached or not, a URL answering or
refused, a unit's journal with no entries on a machine without systemd, py-spy found or not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import forensics.twin as twin_api
from forensics import readiness
from forensics.exitcodes import UsageProblem
from forensics.inventory import load
from forensics.inventory.starter import EngineAnswer, starting_inventory

FORENSICS = [sys.executable, "-m", "forensics"]
PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def _init(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FORENSICS, "init", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("text, host, user, url", [
    ("ops@10.0.3.17:30000", "10.0.3.17", "ops", "http://10.0.3.17:30000"),
    ("10.0.3.17", "10.0.3.17", None, "http://10.0.3.17:30000"),
    ("http://pd-prefill-0.internal:31000", "pd-prefill-0.internal", None, "http://pd-prefill-0.internal:31000"),
    ("https://ops@gpu-7.example.com", "gpu-7.example.com", "ops", "https://gpu-7.example.com:443"),
    ("localhost:30000", "local", None, "http://localhost:30000"),
    ("ops@127.0.0.1:30000", "127.0.0.1", "ops", "http://127.0.0.1:30000"),  # a user: over SSH, as asked
    ("ops@[fd00::17]:30000", "fd00::17", "ops", "http://[fd00::17]:30000"),
])
def test_an_engine_is_read_as_people_write_it(text, host, user, url):
    answer = EngineAnswer.parse("prefill", text)
    assert (answer.host, answer.user, answer.url) == (host, user, url)


@pytest.mark.parametrize("text, complaint", [
    ("ops@10.0.3.17:99999", "not a TCP port"),
    ("http://10.0.3.17:30000/generate", "without a path"),
    ("http://ops:hunter2@10.0.3.17:30000", "password in the URL is refused"),
    ("ops@@10.0.3.17", r"expected \[user@\]host:port"),
    ("ftp://10.0.3.17", r"expected \[user@\]host:port"),
])
def test_a_wrong_engine_is_a_usage_error_naming_the_option(text, complaint):
    with pytest.raises(UsageProblem, match=complaint) as caught:
        EngineAnswer.parse("decode", text)
    assert "--decode" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_the_written_inventory_is_what_the_loader_reads_with_one_host_per_address(tmp_path):
    text = starting_inventory(
        "pd-prod-7", [EngineAnswer.parse("prefill", "ops@10.0.3.17:30000"), EngineAnswer.parse("decode", "ops@10.0.3.18"),
                      EngineAnswer.parse("router", "http://10.0.3.18:8000")],
        jump="ops@bastion.example.com:2222", units={"prefill": "sglang-prefill.service"}, sudo=True,
        key="~/.ssh/pd_ops_ed25519")
    path = tmp_path / "inventory.toml"
    path.write_text(text)
    inv = load(path)
    assert [e.role for e in inv.engines] == ["prefill", "decode", "router"]
    assert sorted(inv.hosts) == ["bastion", "decode-node", "prefill-node"]  # the router shares the decode's
    assert inv.hosts["prefill-node"].jump == "bastion" and inv.hosts["bastion"].port == 2222
    prefill = inv.engine("prefill")
    assert prefill.bootstrap_port == 8998 and prefill.log_source.value == "sglang-prefill.service"
    assert prefill.sudo and prefill.selector.title == "sglang::scheduler"
    with pytest.raises(UsageProblem, match="needs a decode"):
        starting_inventory("x", [EngineAnswer.parse("prefill", "a:1")])
    with pytest.raises(UsageProblem, match="no router engine"):
        starting_inventory("x", [EngineAnswer.parse("prefill", "a:1"), EngineAnswer.parse("decode", "b:1")],
                           units={"router": "r.service"})
    with pytest.raises(UsageProblem, match="one user per host"):
        starting_inventory("x", [EngineAnswer.parse("prefill", "ops@a:1"), EngineAnswer.parse("decode", "root@a:2")])


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    deployment = twin_api.up("0.5.15", directory=tmp_path_factory.mktemp("init-twin"))
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


@pytest.mark.server
def test_init_on_a_local_deployment_passes_every_check_and_says_what_next(twin, tmp_path):
    result = _init("--prefill", twin.prefill, "--decode", twin.decode, "--router", twin.router, "--py-spy", PY_SPY,
                   "--name", "local-pd", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    written = tmp_path / "inventory.toml"
    assert "next: forensics diagnose --inventory inventory.toml" in result.stdout
    inv = load(written)
    assert inv.name == "local-pd" and inv.engine("prefill").url == twin.prefill
    assert result.stderr.count("ok  ") == 4  # three URLs and py-spy; nothing to reach over SSH
    again = _init("--prefill", twin.prefill, "--decode", twin.decode, cwd=tmp_path)
    assert again.returncode == 2 and "inventory.toml exists" in again.stderr  # never overwritten silently


@pytest.mark.server
def test_init_lists_each_failed_check_with_what_to_do(twin, tmp_path):
    result = _init("--prefill", twin.prefill, "--decode", "localhost:1", "--unit", "prefill=sglang-prefill.service",
                   "--py-spy", str(tmp_path / "no-py-spy"), "--json", "--out", str(tmp_path / "inv.toml"))
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "not ready" and doc["ready"] is False
    failed = {(c["what"], c["target"]): c for c in doc["checks"] if not c["ok"]}
    assert set(failed) == {("url", "decode-0 (local)"), ("journal", "prefill-0 (local)"), ("py-spy", "local")}
    assert "Connection refused" in failed[("url", "decode-0 (local)")]["detail"]
    assert all(c["fix"] for c in failed.values())


@pytest.mark.server
def test_init_over_ssh_reaches_the_host_and_names_an_unreachable_jump(twin, sshd, tmp_path):
    common = ["--prefill", f"{sshd.user}@127.0.0.1:{twin.settings.prefill_port}",
              "--decode", f"{sshd.user}@127.0.0.1:{twin.settings.decode_port}",
              "--ssh-port", str(sshd.port), "--key", str(sshd.client_key), "--known-hosts", str(sshd.known_hosts),
              "--py-spy", PY_SPY]
    good = _init(*common, "--out", str(tmp_path / "ssh.toml"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "ok   host prefill-node: reached over SSH" in good.stderr  # one [hosts] table for the address
    check = readiness.check(tmp_path / "ssh.toml")
    assert not check.failed and repr(check).startswith("<Readiness ready")
    behind = _init(*common, "--jump", f"{sshd.user}@127.0.0.1:1", "--out", str(tmp_path / "jump.toml"))
    assert behind.returncode == 1
    assert "FAIL host prefill-node: not reached: through jump host bastion" in behind.stderr
