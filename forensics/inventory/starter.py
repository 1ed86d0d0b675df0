"""A starting inventory from a few answers: where each engine is, how to reach it, its unit.

``forensics init`` asks for (or takes as flags) what an on-call engineer knows at 3 a.m.: each
engine as ``[user@]host:port`` (its HTTP port) or a URL, a bastion, the systemd units, and writes
the inventory every other command reads. The text is built as data and loaded back with the
inventory's own loader before it is written, so a starting inventory is always a valid one.

    from forensics.inventory.starter import EngineAnswer, starting_inventory
    text = starting_inventory("pd-prod-7", [EngineAnswer.parse("prefill", "ops@10.0.3.17:30000"),
                                            EngineAnswer.parse("decode", "ops@10.0.3.18:30000")],
                              jump="ops@bastion.example.com", units={"prefill": "sglang-prefill.service"})
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import tomli_w

from forensics.exitcodes import UsageProblem
from forensics.inventory.load import loads

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "local")
_HOST_PORT = re.compile(r"^(?:(?P<user>[A-Za-z0-9_.][A-Za-z0-9_.-]*)@)?(?P<host>\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.-]+)"
                        r"(?::(?P<port>\d{1,5}))?$")
DEFAULT_PORTS = {"prefill": 30000, "decode": 30000, "router": 8000}
DEFAULT_BOOTSTRAP_PORT = 8998  # sglang's --disaggregation-bootstrap-port default


@dataclass(frozen=True)
class EngineAnswer:
    """One engine as given: its role, the SSH user and host it runs on, and its HTTP URL."""

    role: str
    host: str  # address, or "local"
    user: str | None
    url: str

    @classmethod
    def parse(cls, role: str, text: str) -> EngineAnswer:
        """``[user@]host[:port]`` (the engine's HTTP port, default 30000; 8000 for a router) or
        ``http(s)://[user@]host:port``; a UsageProblem names the role and what was wrong."""
        text = text.strip()
        if "://" in text:
            parts = urlsplit(text)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UsageProblem(f"--{role} {text!r}: expected [user@]host:port or http(s)://host:port")
            if parts.path not in ("", "/") or parts.query or parts.fragment:
                raise UsageProblem(f"--{role} {text!r}: give the engine's base URL, without a path or query")
            if parts.password:
                raise UsageProblem(f"--{role}: a password in the URL is refused (use an SSH key or agent)")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            host, user, scheme = parts.hostname, parts.username, parts.scheme
        else:
            match = _HOST_PORT.match(text)
            if not match:
                raise UsageProblem(f"--{role} {text!r}: expected [user@]host:port (the engine's HTTP port), "
                                   "e.g. ops@10.0.3.17:30000")
            host, user, scheme = match.group("host").strip("[]"), match.group("user"), "http"
            port = int(match.group("port")) if match.group("port") else DEFAULT_PORTS.get(role, 30000)
        if not 1 <= port <= 65535:
            raise UsageProblem(f"--{role} {text!r}: port {port} is not a TCP port")
        local = host in LOCAL_NAMES and not user  # ops@127.0.0.1: over SSH, as asked
        shown = "127.0.0.1" if host == "local" else (f"[{host}]" if ":" in host else host)
        return cls(role, "local" if local else host, None if local else user, f"{scheme}://{shown}:{port}")


def _host_name(answer: EngineAnswer, taken: dict[str, str]) -> str:
    """One [hosts] table per address (a router beside its decode shares the decode's)."""
    key = answer.host
    if key not in taken:
        base = re.sub(r"[^A-Za-z0-9_.-]", "-", answer.host)
        name = f"{answer.role}-node" if base.replace(".", "").isdigit() or ":" in answer.host else base
        while name in taken.values():
            name += "-2"
        taken[key] = name
    return taken[key]


def starting_inventory(name: str, engines: list[EngineAnswer], *, jump: str | None = None,
                       units: dict[str, str] | None = None, sglang: str | None = None, backend: str | None = None,
                       sudo: bool = False, key: str | None = None, py_spy: str | None = None,
                       prometheus: str | None = None, bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
                       ssh_port: int | None = None, known_hosts: str | None = None) -> str:
    """The TOML text of an inventory for ``engines`` (checked by loading it back)."""
    units = dict(units or {})
    roles = [e.role for e in engines]
    for role in ("prefill", "decode"):
        if role not in roles:
            raise UsageProblem(f"an inventory needs a {role}: give --{role} [user@]host:port")
    unknown = sorted(set(units) - set(roles))
    if unknown:
        raise UsageProblem(f"--unit {unknown[0]}=...: no {unknown[0]} engine was given")
    deployment = {"name": name, **_given(sglang=sglang, backend=backend, prometheus=prometheus)}
    data: dict = {"deployment": deployment, "hosts": {}, "engine": []}
    taken: dict[str, str] = {}
    if jump:
        user, address, port = parse_ssh(jump, "--jump")
        data["hosts"]["bastion"] = _ssh_table(address, user, key, None, False, None, port=port,
                                              known_hosts=known_hosts)
    for answer in engines:
        engine: dict = {"role": answer.role, "url": answer.url}
        if answer.host == "local":
            engine["host"] = "local"
        else:
            host = _host_name(answer, taken)
            engine["host"] = host
            if host not in data["hosts"]:
                data["hosts"][host] = _ssh_table(answer.host, answer.user, key, "bastion" if jump else None, sudo,
                                                 py_spy, port=ssh_port, known_hosts=known_hosts)
            elif answer.user and "user" not in data["hosts"][host]:
                data["hosts"][host]["user"] = answer.user
            elif answer.user and data["hosts"][host]["user"] != answer.user:
                raise UsageProblem(f"--{answer.role}: {answer.host} is given as user {answer.user!r} here and "
                                   f"{data['hosts'][host]['user']!r} for another engine; one user per host")
        if answer.role in units:
            engine["logs"] = {"unit": units[answer.role]}
            engine["restart"] = f"sudo systemctl restart {units[answer.role]}"
        if answer.role == "prefill":
            engine["bootstrap_port"] = bootstrap_port
        if answer.role in ("prefill", "decode"):
            engine["process"] = {"title": "sglang::scheduler", "cmdline": f"--disaggregation-mode {answer.role}"}
        else:
            engine["process"] = {"cmdline": "sglang_router"}
        data["engine"].append(engine)
    if any(a.host == "local" for a in engines) and (sudo or py_spy):
        data["hosts"]["local"] = _given(sudo=sudo, py_spy=py_spy)
    if not data["hosts"]:
        del data["hosts"]
    text = tomli_w.dumps(data)
    loads(text, f"<inventory for {name}>")  # what is written is what the loader accepts
    return text


def parse_ssh(text: str, option: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` as (user, host, port); a UsageProblem names the option."""
    bare = text.strip().removeprefix("ssh://")
    match = _HOST_PORT.match(bare)
    if not match:
        raise UsageProblem(f"{option} {text!r}: expected [user@]host[:port], e.g. ops@bastion.example.com")
    port = int(match.group("port")) if match.group("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise UsageProblem(f"{option} {text!r}: port {port} is not a TCP port")
    return match.group("user"), match.group("host").strip("[]"), port


def _ssh_table(address: str, user: str | None, key: str | None, jump: str | None, sudo: bool,
               py_spy: str | None, port: int | None = None, known_hosts: str | None = None) -> dict:
    return {"address": address, **_given(known_hosts=known_hosts, user=user, port=port, key=key, jump=jump,
                                         sudo=sudo, py_spy=py_spy)}


def _given(**values) -> dict:
    """The keys given a value (a table leaves out what the loader's defaults decide)."""
    return {name: value for name, value in values.items() if value}
