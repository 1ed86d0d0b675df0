"""The inventory of a live deployment: [hosts] tables, several engines per role, log sources,
process selectors, Prometheus; errors naming file, line and key; hosts built against a real sshd."""

from __future__ import annotations

import os
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

import forensics.inventory as inventory
from forensics.inventory import Host, InventoryError, Locator, LogSpec, ProcessSelector, format_path
from forensics.twin import inventory as old_inventory

pytestmark = pytest.mark.timeout(120)

SAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "pd-two-node.toml"

BASE = """\
[deployment]
name = "pd-test"

[[engine]]
role = "prefill"
host = "local"
url = "http://10.0.3.17:30000"
bootstrap_port = 8998

[[engine]]
role = "decode"
host = "local"
url = "http://10.0.3.18:30000"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _reloaded(inv, tmp_path: Path):
    """``inv`` written and read back (with the original's path, the one thing that differs)."""
    return replace(inventory.load(inventory.dump(inv, tmp_path / "copy.toml")), path=inv.path)


def _line_of(path: Path, needle: str, nth: int = 0) -> int:
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text]
    return lines[nth]


# -- the sample --------------------------------------------------------------------------------------


def test_the_two_node_sample_describes_the_deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # ~ in key paths, and no ~/.ssh/config of the test user
    inv = inventory.load(SAMPLE)
    assert (inv.name, inv.sglang, inv.backend, inv.prometheus) == ("pd-prod-7", "0.5.15", "nixl", "http://10.0.3.5:9090")
    assert not inv.is_twin
    assert [e.name for e in inv.engines] == ["prefill-0", "decode-0", "router"]
    prefill, decode, router = inv.engine("prefill"), inv.engine("decode"), inv.engine("router")
    assert prefill.label == "prefill-0 (ssh://ops@10.0.3.17:22)"
    assert decode.label == "decode-0 (ssh://ops@10.0.3.18:22)" and router.host == decode.host
    assert prefill.bootstrap_url == "http://10.0.3.17:8998"
    assert prefill.log_source == LogSpec("unit", "sglang-prefill.service")
    assert router.log_source == LogSpec("unit", "sglang-router.service")
    assert prefill.selector == ProcessSelector(title="sglang::scheduler", cmdline="--disaggregation-mode prefill")
    assert router.selector == ProcessSelector(cmdline="sglang_router.launch_router")
    for engine in inv.engines:
        assert engine.sudo is True and engine.py_spy == "/opt/sglang/.venv/bin/py-spy"
        assert engine.journalctl == "journalctl" and engine.restart.startswith("sudo systemctl restart ")
    assert set(inv.hosts) == {"bastion", "prefill-node", "decode-node"}
    assert inv.hosts["bastion"].sudo is False and inv.hosts["bastion"].connect_timeout == 10
    assert inv.hosts["prefill-node"].jump == inv.hosts["decode-node"].jump == "bastion"

    # Command hosts: one object per [hosts] name, the bastion shared as the jump of both nodes.
    from forensics.hosts import SSHHost

    p_host, d_host, r_host = (inv.host_for(e) for e in (prefill, decode, router))
    try:
        assert isinstance(p_host, SSHHost) and d_host is r_host and inv.host_for("decode-0") is d_host
        assert (p_host.name, p_host.target.hostname, p_host.target.user, p_host.target.port) == (
            "prefill-node", "10.0.3.17", "ops", 22)
        assert p_host.target.identity_files == (str(tmp_path / ".ssh" / "pd_ops_ed25519"),)
        assert p_host.known_hosts == str(tmp_path / ".ssh" / "known_hosts")  # strict host keys, the default one
        assert p_host.jump is d_host.jump and p_host.jump.name == "bastion"
        assert p_host.jump.target.hostname == "bastion.pd.example.com" and p_host.jump.connect_timeout == 10.0
    finally:
        inv.close_hosts()
    assert inv.host_for(prefill) is not p_host  # closed hosts are forgotten
    inv.close_hosts()

    # Written back and read again, it is the same inventory (and the same TOML).
    copy = inventory.dump(inv, tmp_path / "copy.toml")
    assert inventory.load(copy).to_dict() == inv.to_dict()
    assert tomllib.loads(copy.read_text()) == tomllib.loads(SAMPLE.read_text())


def test_old_import_path_is_the_same_format():
    assert old_inventory.load is inventory.load and old_inventory.Inventory is inventory.Inventory
    assert old_inventory.InventoryError is InventoryError and old_inventory.Host is Host


# -- engines -----------------------------------------------------------------------------------------


def test_several_engines_per_role_with_default_and_given_names(tmp_path):
    path = _write(tmp_path, BASE + """
[[engine]]
role = "decode"
name = "decode-b"
host = "local"
url = "http://10.0.3.19:30000"

[[engine]]
role = "decode"
host = "local"
url = "http://10.0.3.20:30000"

[[engine]]
role = "prefill"
host = "local"
url = "http://10.0.3.21:30000"
bootstrap_port = 8999
""")
    inv = inventory.load(path)
    assert [e.name for e in inv.engines] == ["prefill-0", "decode-0", "decode-b", "decode-2", "prefill-1"]
    assert [e.url for e in inv.engines_with("decode")] == [
        "http://10.0.3.18:30000", "http://10.0.3.19:30000", "http://10.0.3.20:30000"]
    assert inv.engine("decode").name == "decode-0" and inv.engine("prefill").name == "prefill-0"
    assert inv.engine_named("decode-b").url == "http://10.0.3.19:30000"
    assert inv.engines_with("router") == []
    with pytest.raises(InventoryError, match="no \\[\\[engine\\]\\] with role = 'router'"):
        inv.engine("router")
    with pytest.raises(InventoryError, match="no \\[\\[engine\\]\\] named 'nope'"):
        inv.engine_named("nope")
    # Default names stay out of the written file; given ones stay in.
    written = inv.to_dict()["engine"]
    assert [e.get("name") for e in written] == [None, None, "decode-b", None, None]
    assert _reloaded(inv, tmp_path) == inv
    local = inv.host_for(inv.engines[0])
    assert local is inv.host_for(inv.engines[3]) and type(local).__name__ == "LocalHost"
    assert local.run(["echo", "hi"]).stdout == b"hi\n"
    inv.close_hosts()


def test_log_sources_new_and_old_spellings(tmp_path):
    engines = """
[[engine]]
role = "router"
name = "r-{n}"
host = "local"
url = "http://10.0.3.30:8000"
{logs}
"""
    cases = [
        ('logs = { unit = "sglang-router.service" }', LogSpec("unit", "sglang-router.service")),
        ('logs = { file = "/var/log/sglang/router.log" }', LogSpec("file", "/var/log/sglang/router.log")),
        ('logs = { command = ["docker", "logs", "--timestamps", "sglang-router"] }',
         LogSpec("command", ("docker", "logs", "--timestamps", "sglang-router"))),
        ('logs = { journal_file = "/srv/x.journal" }', LogSpec("journal_file", "/srv/x.journal")),
        ('logs.journal_dir = "/var/log/journal/remote"', LogSpec("journal_dir", "/var/log/journal/remote")),
        ('[engine.logs]\nfile = "/var/log/r.log"', LogSpec("file", "/var/log/r.log")),
        ('unit = "old.service"', LogSpec("unit", "old.service")),
        ('log_file = "/var/log/old.log"', LogSpec("file", "/var/log/old.log")),
        ("", None),
    ]
    text = BASE + "".join(engines.format(n=i, logs=logs) for i, (logs, _) in enumerate(cases))
    inv = inventory.load(_write(tmp_path, text))
    assert [e.log_source for e in inv.engines_with("router")] == [spec for _, spec in cases]
    assert inv.engine_named("r-6").unit == "old.service" and inv.engine_named("r-7").log_file == "/var/log/old.log"
    # The older fields mirror a unit or file source, whichever spelling the file uses.
    assert (inv.engine_named("r-0").unit, inv.engine_named("r-0").log_file) == ("sglang-router.service", None)
    assert (inv.engine_named("r-5").unit, inv.engine_named("r-5").log_file) == (None, "/var/log/r.log")
    assert (inv.engine_named("r-2").unit, inv.engine_named("r-2").log_file) == (None, None)
    written = [e.get("logs", e.get("unit", e.get("log_file"))) for e in inv.to_dict()["engine"][2:]]
    assert written == [{"unit": "sglang-router.service"}, {"file": "/var/log/sglang/router.log"},
                       {"command": ["docker", "logs", "--timestamps", "sglang-router"]},
                       {"journal_file": "/srv/x.journal"}, {"journal_dir": "/var/log/journal/remote"},
                       {"file": "/var/log/r.log"}, "old.service", "/var/log/old.log", None]
    again = inventory.load(inventory.dump(inv, tmp_path / "copy.toml"))
    assert [e.log_source for e in again.engines] == [e.log_source for e in inv.engines]


def test_process_selectors_new_and_old_spellings(tmp_path):
    text = BASE.replace('bootstrap_port = 8998\n', 'bootstrap_port = 8998\nprocess = "sglang::scheduler"\n'
                        'pid_file = "/run/sglang/prefill.pid"\n') + """
[[engine]]
role = "router"
host = "local"
url = "http://10.0.3.30:8000"
process = { title = "sglang::router", cmdline = "--port 8000", pid_file = "/run/r.pid" }

[[engine]]
role = "router"
host = "local"
url = "http://10.0.3.31:8000"
process = { cmdline = "sglang_router" }
pid_file = "/run/r1.pid"
"""
    inv = inventory.load(_write(tmp_path, text))
    assert inv.engine("prefill").selector == ProcessSelector(title="sglang::scheduler", pid_file="/run/sglang/prefill.pid")
    assert inv.engine("prefill").process == "sglang::scheduler"
    assert inv.engine("decode").selector is None and inv.engine("decode").log_source is None
    routers = inv.engines_with("router")
    assert routers[0].selector == ProcessSelector("sglang::router", "--port 8000", "/run/r.pid")
    assert routers[1].selector == ProcessSelector(cmdline="sglang_router", pid_file="/run/r1.pid")
    # ``process`` (the title) and ``pid_file`` read the same whichever spelling the file uses.
    assert (routers[0].process, routers[0].process_cmdline, routers[0].pid_file) == (
        "sglang::router", "--port 8000", "/run/r.pid")
    assert (routers[1].process, routers[1].pid_file) == (None, "/run/r1.pid")
    written = inv.to_dict()["engine"]
    assert (written[0]["process"], written[0]["pid_file"]) == ("sglang::scheduler", "/run/sglang/prefill.pid")
    assert written[2]["process"] == {"title": "sglang::router", "cmdline": "--port 8000", "pid_file": "/run/r.pid"}
    assert _reloaded(inv, tmp_path) == inv


def test_hosts_table_keys_and_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    text = """\
[deployment]
name = "pd-test"
prometheus = "https://prom.example.com:9090/"

[hosts.local]
sudo = true
journalctl = "/usr/bin/journalctl"

[hosts.jumpy]
address = "203.0.113.9"
user = "jump"
port = 2200
known_hosts = "~/kh"
ssh_config = "~/cfg"

[hosts.node]
address = "10.0.0.5"
user = "ops"
port = 2222
key = "~/.ssh/k"
jump = "jumpy"
known_hosts = "~/kh"
ssh_config = "~/cfg"
py_spy = "/usr/local/bin/py-spy"
connect_timeout = 2.5

[hosts.other]
jump = "ssh://j@198.51.100.1:2022"
ssh_config = "~/cfg"
key = "~/.ssh/k"

[[engine]]
role = "prefill"
host = "node"
url = "http://10.0.0.5:30000"
bootstrap_port = 8998

[[engine]]
role = "decode"
host = "local"
url = "http://127.0.0.1:30001"

[[engine]]
role = "decode"
host = "other"
url = "http://10.0.0.6:30001"

[[engine]]
role = "router"
host = "ssh://me@[fd00::7]:2022"
url = "http://10.0.0.7:8000"
"""
    (tmp_path / "cfg").write_text("")
    inv = inventory.load(_write(tmp_path, text))
    assert inv.prometheus == "https://prom.example.com:9090"
    node = inv.hosts["node"]
    assert (node.address, node.user, node.port, node.key, node.jump, node.sudo, node.connect_timeout) == (
        "10.0.0.5", "ops", 2222, "~/.ssh/k", "jumpy", False, 2.5)
    assert inv.hosts["other"].address == "other"  # address defaults to the table's name
    prefill, local_decode, other_decode = inv.engines[:3]
    assert (prefill.sudo, prefill.py_spy, prefill.journalctl) == (False, "/usr/local/bin/py-spy", "journalctl")
    assert (local_decode.sudo, local_decode.py_spy, local_decode.journalctl) == (True, "py-spy", "/usr/bin/journalctl")
    assert local_decode.label == "decode-0 (local)"
    router = inv.engine("router")
    assert (router.sudo, router.py_spy, router.journalctl) == (False, "py-spy", "journalctl")
    assert router.label == "router-0 (ssh://me@[fd00::7]:2022)"

    h = inv.host_for(prefill)
    try:
        t = h.target
        assert (h.name, t.hostname, t.user, t.port, t.identity_files) == (
            "node", "10.0.0.5", "ops", 2222, (str(tmp_path / ".ssh" / "k"),))
        assert h.known_hosts == str(tmp_path / "kh") and h.connect_timeout == 2.5
        assert (h.jump.name, h.jump.target.hostname, h.jump.target.user, h.jump.target.port) == (
            "jumpy", "203.0.113.9", "jump", 2200)
        assert inv.host_for(inv.engine_named("decode-1")).jump.target.identity_files == (str(tmp_path / ".ssh" / "k"),)
        url_jump = inv.host_for(other_decode).jump
        assert (url_jump.target.hostname, url_jump.target.user, url_jump.target.port) == ("198.51.100.1", "j", 2022)
        routed = inv.host_for(router)
        assert (routed.target.hostname, routed.target.user, routed.target.port) == ("fd00::7", "me", 2022)
        assert type(inv.host_for(local_decode)).__name__ == "LocalHost"
    finally:
        inv.close_hosts()
    assert _reloaded(inv, tmp_path) == inv


# -- errors: file, line, key ------------------------------------------------------------------------

HOSTS = """\
[deployment]
name = "pd-test"

[hosts.a]
address = "10.0.0.1"
user = "ops"

[hosts.b]
address = "10.0.0.2"
jump = "a"

[[engine]]
role = "prefill"
host = "a"
url = "http://10.0.0.1:30000"
bootstrap_port = 8998
logs = { unit = "p.service" }

[[engine]]
role = "decode"
host = "b"
url = "http://10.0.0.2:30000"
logs = { unit = "d.service" }
"""


def _edit(old: str, new: str, text: str = HOSTS):
    def edit() -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return edit


# (edit, needle that marks the reported line (nth match), key, what)
ERRORS = [
    (_edit('logs = { unit = "d.service" }', "logs = { unit = 5 }"), ("unit = 5", 0),
     "engine[1].logs.unit", "expected str, got int 5"),
    (_edit('logs = { unit = "d.service" }', 'logs = { unit = "d", file = "/x" }'), ('unit = "d"', 0),
     "engine[1].logs", "give exactly one log source (unit, file, command, journal_file, journal_dir), got 2: unit, file"),
    (_edit('logs = { unit = "d.service" }', "logs = {}"), ("logs = {}", 0),
     "engine[1].logs", "give exactly one log source (unit, file, command, journal_file, journal_dir), got none"),
    (_edit('logs = { unit = "d.service" }', 'logs = { journald = "d" }'), ("journald", 0),
     "engine[1].logs.journald", "unknown log source; allowed: unit, file, command, journal_file, journal_dir"),
    (_edit('logs = { unit = "d.service" }', 'logs = "d.service"'), ('logs = "d', 0),
     "engine[1].logs", "expected a table like { unit = \"sglang-prefill.service\" }, got str 'd.service'"),
    (_edit('logs = { unit = "d.service" }', 'logs = { command = "docker logs d" }'), ("command", 0),
     "engine[1].logs.command", 'expected a non-empty list of strings (an argv such as ["docker", "logs", "c"], '
     "never a shell line), got str 'docker logs d'"),
    (_edit('logs = { unit = "d.service" }', 'logs = { command = [\n  "docker",\n  5,\n] }'), ("  5,", 0),
     "engine[1].logs.command[1]", "expected str, got int 5"),
    (_edit('logs = { unit = "d.service" }', 'logs.unit = 7'), ("logs.unit = 7", 0),
     "engine[1].logs.unit", "expected str, got int 7"),
    (_edit('logs = { unit = "d.service" }', '[engine.logs]\nfile = ""'), ('file = ""', 0),
     "engine[1].logs.file", "expected a non-empty string"),
    (_edit('logs = { unit = "d.service" }', 'logs = { unit = "d.service" }\nunit = "d.service"'),
     ("logs = {", 1), "engine[1].logs", "give the log source once: logs = {...} or the older unit, not both"),
    (_edit('logs = { unit = "d.service" }', 'log_file = "a"\nunit = "b"'), ('unit = "b"', 0),
     "engine[1].unit", "give either log_file or unit as the log source, not both"),
    (_edit('logs = { unit = "p.service" }', 'process = { titel = "x" }'), ("titel", 0),
     "engine[0].process.titel", "unknown key; allowed: title, cmdline, pid_file"),
    (_edit('logs = { unit = "p.service" }', "process = {}"), ("process = {}", 0),
     "engine[0].process", "give at least one of title, cmdline, pid_file"),
    (_edit('logs = { unit = "p.service" }', "process = 3"), ("process = 3", 0),
     "engine[0].process", 'expected a process title (str) or a table like { title = "sglang::scheduler" }, got int 3'),
    (_edit('logs = { unit = "p.service" }', 'process = { pid_file = "/a" }\npid_file = "/b"'), ("process =", 0),
     "engine[0].process.pid_file", "pid_file given twice (here and as the engine's pid_file key): keep one"),
    (_edit('role = "decode"', 'role = "decode"\nnamez = "x"'), ("namez", 0),
     "engine[1].namez", "unknown key; allowed: role, name, host, url, python, sglang_location, sglang, bootstrap_port, logs, "
     "log_file, unit, stderr_file, process, pid_file, restart"),
    (_edit('role = "decode"', 'role = "decode"\nname = "has space"'), ("has space", 0),
     "engine[1].name", "'has space': use letters, digits and '.', '_', '-', ':', '@'"),
    (_edit('role = "decode"', 'role = "decode"\nname = "prefill-0"'), ('name = "prefill-0"', 0),
     "engine[1].name", "name 'prefill-0' is already the name of engine[0] (line 12); engine names must be unique"),
    (_edit('role = "decode"', 'role = "decode"\nname = "x"', _edit('role = "prefill"', 'role = "prefill"\nname = "x"')()),
     ('name = "x"', 1), "engine[1].name", "name 'x' is already the name of engine[0] (line 14); engine names must be unique"),
    (_edit('host = "b"', 'host = "c"'), ('host = "c"', 0),
     "engine[1].host", "unknown host 'c': expected 'local', 'ssh://[user@]host[:port]' or the name of a [hosts] table "
     "(known: ['a', 'b'])"),
    (_edit('host = "b"', 'host = "ftp://b"'), ("ftp://b", 0),
     "engine[1].host", "expected 'local' or 'ssh://[user@]host[:port]', got 'ftp://b' or a [hosts] name"),
    (_edit('user = "ops"', 'user = "ops"\nport = "22"'), ('port = "22"', 0), "hosts.a.port", "expected int, got str '22'"),
    (_edit('user = "ops"', "user = \"ops\"\nport = 70000"), ("port = 70000", 0), "hosts.a.port", "70000 is not a TCP port"),
    (_edit('user = "ops"', 'user = "ops"\nsudo = "yes"'), ('sudo = "yes"', 0), "hosts.a.sudo", "expected bool, got str 'yes'"),
    (_edit('user = "ops"', 'user = "ops"\nconnect_timeout = 0'), ("connect_timeout", 0),
     "hosts.a.connect_timeout", "expected a positive number of seconds, got 0"),
    (_edit('user = "ops"', 'user = "ops"\npy_spy = 1'), ("py_spy", 0), "hosts.a.py_spy", "expected str, got int 1"),
    (_edit('address = "10.0.0.1"', 'address = "ops@10.0.0.1"'), ("ops@", 0), "hosts.a.address",
     "expected a host name or IP address (user and port are keys of their own), got 'ops@10.0.0.1'"),
    (_edit('user = "ops"', 'usr = "ops"'), ("usr", 0), "hosts.a.usr",
     "unknown key; allowed: address, user, port, key, jump, sudo, known_hosts, ssh_config, py_spy, journalctl, "
     "connect_timeout"),
    (_edit('jump = "a"', 'jump = "nowhere"'), ("nowhere", 0), "hosts.b.jump",
     "no [hosts.nowhere] table to jump through (known: ['a', 'b']; or give ssh://user@host:port)"),
    (_edit('user = "ops"', 'user = "ops"\njump = "b"'), ('jump = "a"', 0), "hosts.b.jump", "jump hosts form a cycle: a -> b -> a"),
    (_edit('jump = "a"', 'jump = "b"'), ('jump = "b"', 0), "hosts.b.jump", "jump hosts form a cycle: b -> b"),
    (_edit('jump = "a"', 'jump = "ssh://x@"'), ("ssh://x@", 0), "hosts.b.jump",
     "expected 'local' or 'ssh://[user@]host[:port]', got 'ssh://x@' or a [hosts] name"),
    (_edit("[hosts.a]", '[hosts.local]\naddress = "10.1.1.1"\n\n[hosts.a]'), ('address = "10.1.1.1"', 0),
     "hosts.local.address", "unknown key for the local host; allowed: sudo, py_spy, journalctl"),
    (_edit('[hosts.a]', '[hosts."a b"]\n\n[hosts.a]'), ('[hosts."a b"]', 0),
     "hosts.a b", "host name 'a b': use letters, digits, '.', '_' and '-'"),
    (_edit('name = "pd-test"', 'name = "pd-test"\nhosts = 3'), ("hosts = 3", 0),
     "deployment.hosts", "unknown key; allowed: name, sglang, backend, prometheus"),
    (_edit('user = "ops"', 'user = "ops"\npassword = "hunter2"'), ("password", 0), "hosts.a.password",
     'an inventory never holds a password (it would sit in a file others read and copy); give an identity file '
     'with key = "~/.ssh/id_ed25519" in [hosts.NAME], or use ssh-agent'),
    (_edit('role = "decode"', 'role = "decode"\nprocess.Passphrase = "x"'), ("Passphrase", 0), "engine[1].process.Passphrase",
     'an inventory never holds a passphrase (it would sit in a file others read and copy); give an identity file '
     'with key = "~/.ssh/id_ed25519" in [hosts.NAME], or use ssh-agent'),
    (_edit('name = "pd-test"', 'name = "pd-test"\nprometheus = "prom:9090"'), ("prom:9090", 0),
     "deployment.prometheus", "expected http(s)://host[:port], got 'prom:9090'"),
    (_edit('name = "pd-test"', 'name = "pd-test"\nprometeus = "http://p:9090"'), ("prometeus", 0),
     "deployment.prometeus", "unknown key; allowed: name, sglang, backend, prometheus"),
    (_edit('name = "pd-test"', 'sglang = "0.5.15"'), ("[deployment]", 0), "deployment.name", "missing (required)"),
    (_edit("bootstrap_port = 8998\n", ""), ("[[engine]]", 0), "engine[0].bootstrap_port", "required for the prefill role"),
    (_edit("bootstrap_port = 8998", "bootstrap_port = true"), ("bootstrap_port", 0), "engine[0].bootstrap_port",
     "expected int, got bool True"),
    (lambda: HOSTS + "\n[extra]\nx = 1\n", ("[extra]", 0), "extra",
     "unknown top-level key; allowed: deployment, hosts, engine, twin"),
    (lambda: HOSTS + "\n[twin]\ndirectory = \"/t\"\nsglang = \"0.5.15\"\nsglang_root = \"/r\"\nrouter_prt = 1\n",
     ("router_prt", 0), "twin.router_prt", None),
]


@pytest.mark.parametrize(("edit", "needle", "key", "what"), ERRORS, ids=[e[2] + ":" + str(i) for i, e in enumerate(ERRORS)])
def test_every_error_names_file_line_and_key(tmp_path, edit, needle, key, what):
    path = tmp_path / "inv.toml"
    path.write_text(edit())
    line = _line_of(path, *needle)
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    err = caught.value
    if what is None:
        assert str(err).startswith(f"{path}:{line}: {key}: unknown key; allowed: directory, sglang, sglang_root, ")
    else:
        assert str(err) == f"{path}:{line}: {key}: {what}"
    assert (err.file, err.line, err.key, err.path) == (str(path), line, key, str(path))
    assert err.exit_status == 4


def test_the_base_of_the_error_cases_is_valid(tmp_path):
    inv = inventory.load(_write(tmp_path, HOSTS))
    assert inv.engine("decode").host.name == "b" and inv.hosts["b"].jump == "a"


@pytest.mark.parametrize(("text", "message"), [
    ('name = "x"\n', "missing [deployment] table"),
    ('[deployment]\nname = "x"\n', "needs at least one [[engine]] table (a prefill and a decode)"),
    (BASE.replace('"decode"', '"router"'), "no [[engine]] with role = 'decode' (has: ['prefill', 'router'])"),
])
def test_whole_file_errors_name_the_file(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    assert str(caught.value) == f"{path}: {message}" and caught.value.line is None


def test_engine_that_is_not_a_table_and_an_empty_engine_list(tmp_path):
    path = _write(tmp_path, 'engine = []\n[deployment]\nname = "x"\n')
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    assert str(caught.value) == f"{path}:1: engine: needs at least one [[engine]] table (a prefill and a decode)"
    path = _write(tmp_path, 'engine = [\n  1,\n]\n[deployment]\nname = "x"\n')
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    assert str(caught.value) == f"{path}:2: engine[0]: expected a table like [[engine]] role = \"prefill\", got int 1"


def test_toml_syntax_errors_keep_tomllib_line(tmp_path):
    path = _write(tmp_path, BASE.replace('url = "http://10.0.3.18:30000"', 'url = "http://10.0.3.18:30000'))
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    line = _line_of(path, 'url = "http://10.0.3.18:30000')
    assert str(caught.value).startswith(f"{path}:{line}: not valid TOML (") and caught.value.line == line
    assert f"line {line}" in str(caught.value)


def test_parse_without_text_has_no_lines_and_loads_names_its_source():
    data = tomllib.loads(HOSTS.replace('user = "ops"', "user = 1"))
    with pytest.raises(InventoryError) as caught:
        inventory.parse(data, "mem.toml")
    assert str(caught.value) == "mem.toml: hosts.a.user: expected str, got int 1"
    with pytest.raises(InventoryError) as caught:
        inventory.loads(HOSTS.replace('user = "ops"', "user = 1"), "mem.toml")
    assert str(caught.value) == "mem.toml:6: hosts.a.user: expected str, got int 1"
    assert inventory.loads(HOSTS).path is None


def test_locator_paths_and_fallbacks():
    text = textwrap.dedent('''\
        # comment with [[engine]] and key = 1
        [deployment]
        name = "x"  # trailing
        note = """
        [[engine]]
        role = "fake"
        """

        [[engine]]
        role = "prefill"
        "quoted.key" = 1
        logs = { command = ["a", "b"], unit = 'u' }

        [engine.process]
        title = "t"

        [[engine]]
        process.cmdline = "c"

        [hosts.'n.1']
        port = 22
        ''')
    loc = Locator(text)
    assert loc.line(("deployment", "name")) == 3
    assert loc.line(("engine", 0)) == 9 and loc.line(("engine", 0, "role")) == 10
    assert loc.line(("engine", 0, "quoted.key")) == 11
    assert loc.line(("engine", 0, "logs", "command", 1)) == 12 and loc.line(("engine", 0, "logs", "unit")) == 12
    assert loc.line(("engine", 0, "process", "title")) == 15 and loc.line(("engine", 0, "process")) == 14
    assert loc.line(("engine", 1, "process", "cmdline")) == 18 and loc.line(("engine", 1, "missing")) == 17
    assert loc.line(("hosts", "n.1", "port")) == 21 and loc.line(("hosts", "n.1", "user")) == 20
    assert loc.line(("nowhere",)) is None and loc.exact(("engine", 1, "missing")) is None
    assert format_path(("engine", 1, "logs", "command", 0)) == "engine[1].logs.command[0]"


# -- real SSH ---------------------------------------------------------------------------------------


def _ssh_inventory(tmp_path: Path, sshd, known_hosts: Path, *, jump: str | None = None) -> Path:
    def table(name: str) -> str:
        return textwrap.dedent(f"""\
            [hosts.{name}]
            address = "127.0.0.1"
            user = "{sshd.user}"
            port = {sshd.port}
            key = "{sshd.client_key}"
            known_hosts = "{known_hosts}"
            ssh_config = "{os.devnull}"
            connect_timeout = 20
            """)
    hop = f'jump = "{jump}"\n' if jump else ""
    text = f"""\
[deployment]
name = "pd-ssh"

{table("bastion")}
{table("node")}{hop}
[[engine]]
role = "prefill"
host = "node"
url = "http://127.0.0.1:30000"
bootstrap_port = 8998
logs = {{ command = ["echo", "hi"] }}

[[engine]]
role = "decode"
host = "node"
url = "http://127.0.0.1:30001"
"""
    path = tmp_path / "ssh.toml"
    path.write_text(text)
    return path


@pytest.mark.server
@pytest.mark.parametrize("jump", [None, "bastion", "url"])
def test_host_for_runs_commands_over_real_ssh(sshd, tmp_path, jump):
    if jump == "url":
        jump = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}"
    inv = inventory.load(_ssh_inventory(tmp_path, sshd, sshd.known_hosts, jump=jump))
    prefill = inv.engine("prefill")
    host = inv.host_for(prefill)
    try:
        assert host is inv.host_for(inv.engine("decode")) and host.name == "node"
        result = host.run(list(prefill.log_source.value), timeout=30)
        assert result.ok, result
        assert result.stdout == b"hi\n" and result.host == "node"
        if jump is not None:
            import paramiko

            assert isinstance(host._client.get_transport().sock, paramiko.Channel)
            assert host.jump is not None and host.jump._client is not None
            assert host.jump.name == ("bastion" if jump == "bastion" else f"{sshd.user}@127.0.0.1:{sshd.port}")
    finally:
        inv.close_hosts()
    assert host._client is None


@pytest.mark.server
def test_host_for_refuses_a_host_missing_from_known_hosts(sshd, tmp_path):
    from forensics.hosts import UnknownHostKey

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = inventory.load(_ssh_inventory(tmp_path, sshd, empty))
    try:
        with pytest.raises(UnknownHostKey) as caught:
            inv.host_for(inv.engine("prefill")).run(["echo", "hi"], timeout=30)
    finally:
        inv.close_hosts()
    assert f"[127.0.0.1]:{sshd.port}" in str(caught.value) and caught.value.exit_status == 4


def test_the_format_document_lists_every_key():
    """docs/inventory.md has a table row for every key the loader accepts, and no other."""
    import importlib
    import re

    load_mod = importlib.import_module("forensics.inventory.load")  # the package's ``load`` is the function

    doc = (SAMPLE.parent.parent / "inventory.md").read_text()
    sections = {
        "## `[deployment]`": load_mod.DEPLOYMENT_KEYS,
        "## `[hosts.NAME]`": load_mod.HOST_KEYS,
        "## `[[engine]]`": load_mod.ENGINE_KEYS,
        "### `logs`": inventory.LOG_KINDS,
        "### `process`": load_mod.PROCESS_KEYS,
    }
    for heading, keys in sections.items():
        body = doc.split(heading, 1)[1].split("\n#", 1)[0]
        rows = re.findall(r"^\| `([a-z_]+)` \|", body, re.M)
        assert sorted(rows) == sorted(keys), heading


def test_a_journal_source_can_name_the_unit_it_filters(tmp_path):
    from forensics.inventory import loads

    inv = loads('[deployment]\nname = "j"\n\n[[engine]]\nrole = "prefill"\nhost = "local"\nurl = "http://127.0.0.1:1"\n'
                'bootstrap_port = 8998\nlogs = { journal_dir = "/var/log/journal/remote", unit = "sglang-prefill.service" }\n\n'
                '[[engine]]\nrole = "decode"\nhost = "local"\nurl = "http://127.0.0.1:2"\nlogs = { unit = "sglang-decode" }\n',
                "j.toml")
    prefill, decode = inv.engines
    assert (prefill.log_source.kind, prefill.log_source.value, prefill.log_source.unit) == (
        "journal_dir", "/var/log/journal/remote", "sglang-prefill.service")
    assert (decode.log_source.kind, decode.log_source.value, decode.log_source.unit) == ("unit", "sglang-decode", None)
