"""The inventory format: round trip, and errors that name the file and the key."""

from __future__ import annotations

import tomllib

import pytest

from forensics.twin import inventory as inv

GOOD = """
[deployment]
name = "pd-prod-7"
sglang = "0.5.15"
backend = "nixl"

[[engine]]
role = "prefill"
host = "ssh://ops@pd-prefill-0:2222"
url = "http://10.0.3.17:30000"
bootstrap_port = 8998
unit = "sglang-prefill.service"
process = "sglang::scheduler"
python = "/opt/sglang/.venv/bin/python"
restart = "systemctl restart sglang-prefill.service"

[[engine]]
role = "decode"
host = "local"
url = "http://10.0.3.18:30000"
log_file = "/var/log/sglang/decode.log"
"""


def test_live_inventory_loads_and_round_trips(tmp_path):
    path = tmp_path / "prod.toml"
    path.write_text(GOOD)
    loaded = inv.load(path)
    prefill = loaded.engine("prefill")
    assert (prefill.host.kind, prefill.host.user, prefill.host.hostname, prefill.host.port) == ("ssh", "ops", "pd-prefill-0", 2222)
    assert prefill.bootstrap_url == "http://10.0.3.17:8998"
    assert loaded.engine("decode").log_file == "/var/log/sglang/decode.log"
    assert not loaded.is_twin
    # Every key of the file was read (to_dict leaves out what was not), and the copy reads back the same.
    assert loaded.to_dict() == tomllib.loads(GOOD)
    copy = inv.dump(loaded, tmp_path / "copy.toml")
    assert tomllib.loads(copy.read_text()) == tomllib.loads(GOOD)
    assert inv.load(copy).to_dict() == tomllib.loads(GOOD)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('role = "decode"', 'role = "decoder"'), r"engine\[1\]\.role: expected one of"),
        (lambda t: t.replace("bootstrap_port = 8998\n", ""), r"engine\[0\]\.bootstrap_port: required"),
        (lambda t: t.replace('url = "http://10.0.3.18:30000"', 'url = "10.0.3.18"'), r"engine\[1\]\.url: expected http"),
        (lambda t: t.replace('host = "local"', 'host = "ftp://x"'), r"engine\[1\]\.host: expected 'local'"),
        (lambda t: t.replace("bootstrap_port = 8998", 'bootstrap_port = "8998"'), r"engine\[0\]\.bootstrap_port: expected int"),
        (lambda t: t.replace('name = "pd-prod-7"\n', ""), r"deployment\.name: missing"),
        (lambda t: t + "\n[extra]\nx = 1\n", r"unknown top-level key"),
        (lambda t: t.replace('log_file = "/var/log/sglang/decode.log"', 'log_file = "a"\nunit = "b"'), r"either log_file or unit"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(GOOD))
    with pytest.raises(inv.InventoryError, match=message) as info:
        inv.load(path)
    assert str(path) in str(info.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(inv.InventoryError, match="no such inventory file"):
        inv.load(tmp_path / "absent.toml")
    (tmp_path / "broken.toml").write_text("[deployment\n")
    with pytest.raises(inv.InventoryError, match="not valid TOML"):
        inv.load(tmp_path / "broken.toml")
