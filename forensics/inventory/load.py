"""Reading, checking and writing inventory files (``docs/inventory.md`` describes every key).

Every error names the file, the line and the key path (``inv.toml:14: engine[1].logs.unit:
expected str, got int 5``); unknown keys are errors that list the allowed ones, so a typo is
never silently ignored. A ``password`` key anywhere is refused: an inventory never holds one.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import tomli_w

from forensics.redact import REDACTED, redact_text
from forensics.regular_file import read_regular_file

from .errors import InventoryError
from .host_spec import DEFAULT_JOURNALCTL, DEFAULT_PY_SPY, Host, HostConfig
from .locate import KeyPath, Locator, format_path
from .model import (
    BACKENDS,
    LOG_KINDS,
    ROLES,
    Engine,
    Inventory,
    LogSpec,
    ProcessSelector,
    default_name,
)

TOP_KEYS = ("deployment", "hosts", "engine", "twin")
DEPLOYMENT_KEYS = ("name", "sglang", "backend", "prometheus")
ENGINE_KEYS = (
    "role", "name", "host", "url", "python", "sglang_location", "sglang", "bootstrap_port", "logs", "log_file", "unit",
    "stderr_file", "process", "pid_file", "restart",
)
HOST_KEYS = (
    "address", "user", "port", "key", "jump", "sudo", "known_hosts", "ssh_config", "py_spy", "journalctl",
    "connect_timeout",
)
LOCAL_HOST_KEYS = ("sudo", "py_spy", "journalctl")
PROCESS_KEYS = ("title", "cmdline", "pid_file")
SECRET_KEYS = ("password", "passphrase")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]*$")
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TOML_LINE_RE = re.compile(r"at line (\d+)")
# Inventories are a few KiB; this bounds what a wrong path (a log, a device) can cost to read.
MAX_INVENTORY_BYTES = 1024 * 1024


def _shown_url(url: str) -> str:
    """``url`` for an error line: its userinfo, query and fragment as ``<redacted>`` whatever their names."""
    parsed = urlparse(url)
    netloc = parsed.netloc
    if not netloc:
        return redact_text(url)  # not a URL it can take apart (``prom:9090``): shown as written, redacted
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = f"?{REDACTED}" if parsed.query or "?" in url else ""
    fragment = f"#{REDACTED}" if parsed.fragment or "#" in url else ""
    return f"{parsed.scheme}://{netloc}{parsed.path}{query}{fragment}"


def dump(inventory: Inventory, path: str | Path) -> Path:
    """Write ``inventory`` as TOML (atomically: a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tomli_w.dumps(inventory.to_dict()))
    tmp.replace(path)
    return path


def load(path: str | Path) -> Inventory:
    """Read and validate an inventory file; errors name the file, the line and the key."""
    path = Path(path)
    data_bytes = read_capped(path)
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data_bytes[:exc.start].count(b"\n") + 1
        raise InventoryError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
                             f", line {line})", file=str(path), line=line) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE_RE.search(str(exc))
        line = int(found[1]) if found else None
        where = f"{path}:{line}" if line else f"{path}"
        raise InventoryError(f"{where}: not valid TOML ({exc})", file=str(path), line=line) from exc
    return parse(data, path, text=text)


def read_capped(path: Path, limit: int = MAX_INVENTORY_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (``forensics.regular_file``):
    a FIFO, a device or a file over the cap is refused before any read, naming the file."""
    return read_regular_file(path, limit, noun="inventory file",
                             error=lambda message, _unreadable: InventoryError(message, file=str(path)))


def loads(text: str, path: str | Path = "<inventory>") -> Inventory:
    """``load`` for a string (``path`` only names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{path}: not valid TOML ({exc})", file=str(path)) from exc
    return parse(data, path, text=text)


def text_line(path: Path, offset: int) -> int | None:
    """The 1-based line of byte ``offset`` in ``path`` (for errors)."""
    try:
        return path.read_bytes()[:offset].count(b"\n") + 1
    except OSError:
        return None


def parse(data: dict[str, Any], path: str | Path = "<inventory>", *, text: str | None = None) -> Inventory:
    """Validate a decoded inventory document; with its ``text``, errors carry line numbers."""
    return _Checker(path, text).inventory(data)


class _Checker:
    def __init__(self, path: str | Path, text: str | None) -> None:
        self.path = path
        self.locator = Locator(text) if text is not None else None

    # -- errors and typed fields -------------------------------------------------------------------

    def error(self, key: KeyPath, what: str) -> InventoryError:
        line = self.locator.line(key) if self.locator is not None and key else None
        return InventoryError.at(self.path, line, format_path(key) if key else None, what)

    def line(self, key: KeyPath) -> int | None:
        return self.locator.line(key) if self.locator is not None else None

    def get(self, table: dict[str, Any], where: KeyPath, key: str, kind: type | tuple[type, ...], *,
            required: bool = False, nonempty: bool = True) -> Any:
        if key not in table:
            if required:
                raise self.error((*where, key), "missing (required)")
            return None
        value = table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (bool not in kinds and isinstance(value, bool)) or not isinstance(value, kinds):
            expected = "number" if float in kinds else kinds[0].__name__
            raise self.error((*where, key), f"expected {expected}, got {type(value).__name__} {value!r}")
        if nonempty and isinstance(value, str) and not value.strip():
            raise self.error((*where, key), "expected a non-empty string")
        return value

    def table(self, value: Any, where: KeyPath, example: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(where, f"expected a table like {example}, got {type(value).__name__} {value!r}")
        return value

    def only(self, table: dict[str, Any], where: KeyPath, allowed: tuple[str, ...], what: str = "key") -> None:
        unknown = [k for k in table if k not in allowed]
        if not unknown:
            return
        if self.locator is not None:
            unknown.sort(key=lambda k: self.locator.exact((*where, k)) or 0)
        also = f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise self.error((*where, unknown[0]), f"unknown {what}; allowed: {', '.join(allowed)}{also}")

    def port(self, table: dict[str, Any], where: KeyPath, key: str) -> int | None:
        value = self.get(table, where, key, int)
        if value is not None and not 0 < value < 65536:
            raise self.error((*where, key), f"{value} is not a TCP port")
        return value

    def http_url(self, table: dict[str, Any], where: KeyPath, key: str, *, required: bool = False,
                 path_allowed: bool = False) -> str | None:
        """``scheme://host[:port]`` (plus a path prefix where ``path_allowed``), nothing else.

        The tool builds every request URL by appending to this one, so a path or query here
        would end up in the middle of them (``http://h:1/?token=X/health``); and a userinfo or
        query is where a credential hides, which an inventory never holds. The message shows
        the URL redacted: the error line is printed and logged.
        """
        url = self.get(table, where, key, str, required=required)
        if url is None:
            return None
        parsed = urlparse(url)
        try:
            parsed.port  # noqa: B018 - raises on a bad port
        except ValueError:
            parsed = parsed._replace(netloc="")
        shown = _shown_url(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise self.error((*where, key), f"expected http(s)://host[:port], got {shown!r}")
        if "@" in parsed.netloc:
            raise self.error((*where, key), f"{shown!r}: a user or password in the URL is a credential, and an "
                             "inventory never holds one; give http(s)://host[:port]")
        if parsed.query or parsed.fragment or url.rstrip("/").endswith(("?", "#")):
            raise self.error((*where, key), f"{shown!r}: a query or fragment has no place in this URL (requests "
                             "are built by appending a path to it); give http(s)://host[:port]")
        if parsed.path.strip("/") and not path_allowed:
            raise self.error((*where, key), f"{shown!r}: an engine URL is http(s)://host[:port], without a path "
                             f"(got {parsed.path!r}; the tool appends /health, /metrics, ... itself)")
        return url.rstrip("/")

    # -- the document ------------------------------------------------------------------------------

    def inventory(self, data: dict[str, Any]) -> Inventory:
        self.no_secrets(data, ())
        deployment = data.get("deployment")
        if deployment is None:
            raise InventoryError(f"{self.path}: missing [deployment] table", file=str(self.path))
        deployment = self.table(deployment, ("deployment",), '[deployment] name = "pd-prod-7"')
        self.only(data, (), TOP_KEYS, "top-level key")
        self.only(deployment, ("deployment",), DEPLOYMENT_KEYS)
        where = ("deployment",)
        name = self.get(deployment, where, "name", str, required=True)
        sglang = self.get(deployment, where, "sglang", str)
        backend = self.get(deployment, where, "backend", str)
        if backend is not None and backend not in BACKENDS:
            raise self.error((*where, "backend"), f"expected one of {BACKENDS}, got {backend!r}")
        prometheus = self.http_url(deployment, where, "prometheus", path_allowed=True)  # behind a proxy prefix
        hosts = self.hosts(data.get("hosts", {}))
        raw_engines = data.get("engine")
        if not isinstance(raw_engines, list) or not raw_engines:
            line = self.line(("engine",)) if raw_engines is not None else None
            raise InventoryError.at(self.path, line, "engine" if line else None,
                                    "needs at least one [[engine]] table (a prefill and a decode)")
        engines = [self.engine(raw, ("engine", i), hosts) for i, raw in enumerate(raw_engines)]
        self.unique_names(engines)
        roles = [e.role for e in engines]
        for role in ("prefill", "decode"):
            if role not in roles:
                raise InventoryError(f"{self.path}: no [[engine]] with role = {role!r} "
                                     f"(has: {sorted(set(roles))})", file=str(self.path))
        twin = self.twin(data.get("twin", {}))
        return Inventory(name=name, engines=tuple(engines), sglang=sglang, backend=backend, twin=twin,
                         path=Path(self.path) if not str(self.path).startswith("<") else None,
                         hosts=hosts, prometheus=prometheus)

    def no_secrets(self, value: Any, where: KeyPath) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key.lower() in SECRET_KEYS:
                    raise self.error((*where, key), f"an inventory never holds a {key.lower()} (it would sit in a "
                                     "file others read and copy); give an identity file with key = \"~/.ssh/id_ed25519\""
                                     " in [hosts.NAME], or use ssh-agent")
                self.no_secrets(item, (*where, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self.no_secrets(item, (*where, i))

    # -- [hosts.NAME] ------------------------------------------------------------------------------

    def hosts(self, raw: Any) -> dict[str, HostConfig]:
        raw = self.table(raw, ("hosts",), '[hosts.bastion] address = "bastion.example.com"')
        hosts: dict[str, HostConfig] = {}
        for name, table in raw.items():
            where: KeyPath = ("hosts", name)
            if not _HOST_NAME_RE.match(name):
                raise self.error(where, f"host name {name!r}: use letters, digits, '.', '_' and '-'")
            table = self.table(table, where, f'[hosts.{name}] address = "..."')
            hosts[name] = self.host(name, table, where)
        for name in hosts:
            self.no_jump_cycle(name, hosts)
        return hosts

    def host(self, name: str, table: dict[str, Any], where: KeyPath) -> HostConfig:
        if name == "local":
            self.only(table, where, LOCAL_HOST_KEYS, "key for the local host")
        else:
            self.only(table, where, HOST_KEYS)
        address = self.get(table, where, "address", str) or name
        if any(c.isspace() for c in address) or "://" in address or "@" in address:
            raise self.error((*where, "address"), f"expected a host name or IP address (user and port are keys "
                             f"of their own), got {address!r}")
        timeout = self.get(table, where, "connect_timeout", (int, float))
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise self.error((*where, "connect_timeout"), f"expected a positive number of seconds, got {timeout!r}")
        jump = self.get(table, where, "jump", str)
        if jump is not None:
            if jump.startswith("ssh://") or "://" in jump:
                try:
                    Host.parse(jump)
                except ValueError as exc:
                    raise self.error((*where, "jump"), f"{exc} or a [hosts] name") from None
        sudo = self.get(table, where, "sudo", bool)
        return HostConfig(
            name=name, address=address, user=self.get(table, where, "user", str),
            port=self.port(table, where, "port"), key=self.get(table, where, "key", str), jump=jump,
            sudo=bool(sudo), known_hosts=self.get(table, where, "known_hosts", str),
            ssh_config=self.get(table, where, "ssh_config", str),
            py_spy=self.get(table, where, "py_spy", str) or DEFAULT_PY_SPY,
            journalctl=self.get(table, where, "journalctl", str) or DEFAULT_JOURNALCTL,
            connect_timeout=timeout,
        )

    def no_jump_cycle(self, start: str, hosts: dict[str, HostConfig]) -> None:
        chain = [start]
        current = hosts[start]
        while current.jump is not None and "://" not in current.jump:
            where = ("hosts", current.name, "jump")
            if current.jump == "local" or current.jump not in hosts:
                known = sorted(n for n in hosts if n != "local")
                raise self.error(where, f"no [hosts.{current.jump}] table to jump through (known: {known}; "
                                 "or give ssh://user@host:port)")
            if current.jump in chain:
                cycle = " -> ".join([*chain[chain.index(current.jump):], current.jump])
                raise self.error(where, f"jump hosts form a cycle: {cycle}")
            chain.append(current.jump)
            current = hosts[current.jump]

    # -- [[engine]] --------------------------------------------------------------------------------

    def engine(self, raw: Any, where: KeyPath, hosts: dict[str, HostConfig]) -> Engine:
        raw = self.table(raw, where, '[[engine]] role = "prefill"')
        self.only(raw, where, ENGINE_KEYS)
        role = self.get(raw, where, "role", str, required=True)
        if role not in ROLES:
            raise self.error((*where, "role"), f"expected one of {ROLES}, got {role!r}")
        name = self.get(raw, where, "name", str)
        if name is not None and not _NAME_RE.match(name):
            raise self.error((*where, "name"), f"{name!r}: use letters, digits and '.', '_', '-', ':', '@'")
        host = self.engine_host(raw, where, hosts)
        url = self.http_url(raw, where, "url", required=True)
        bootstrap_port = self.port(raw, where, "bootstrap_port")
        if role == "prefill" and bootstrap_port is None:
            raise self.error((*where, "bootstrap_port"), "required for the prefill role")
        log_file = self.get(raw, where, "log_file", str)
        unit = self.get(raw, where, "unit", str)
        if log_file and unit:
            raise self.error((*where, "unit"), "give either log_file or unit as the log source, not both")
        logs = self.logs(raw["logs"], (*where, "logs")) if "logs" in raw else None
        if logs is not None and (log_file or unit):
            old = "log_file" if log_file else "unit"
            raise self.error((*where, "logs"), f"give the log source once: logs = {{...}} or the older {old}, "
                             "not both")
        if logs is not None and logs.kind == "unit":
            unit = logs.value  # mirrored for code that reads the older fields
        elif logs is not None and logs.kind == "file":
            log_file = logs.value
        pid_file = self.get(raw, where, "pid_file", str)
        process = self.process(raw.get("process"), (*where, "process"))
        if isinstance(process, ProcessSelector):
            if process.pid_file and pid_file:
                raise self.error((*where, "process", "pid_file"), "pid_file given twice (here and as the engine's "
                                 "pid_file key): keep one")
            title, cmdline, pid_file = process.title, process.cmdline, process.pid_file or pid_file
        else:
            title, cmdline = process, None
        return Engine(
            role=role, host=host, url=url, bootstrap_port=bootstrap_port, name=name,
            python=self.get(raw, where, "python", str),
            sglang_location=self.get(raw, where, "sglang_location", str),
            sglang=self.get(raw, where, "sglang", str),
            log_file=log_file, unit=unit, logs=logs,
            stderr_file=self.get(raw, where, "stderr_file", str),
            process=title, process_cmdline=cmdline, pid_file=pid_file,
            process_table=isinstance(process, ProcessSelector),
            restart=self.get(raw, where, "restart", str),
        )

    def engine_host(self, raw: dict[str, Any], where: KeyPath, hosts: dict[str, HostConfig]) -> Host:
        text = self.get(raw, where, "host", str, required=True)
        if text == "local":
            return Host.from_config(hosts["local"]) if "local" in hosts else Host("local")
        if "://" in text:
            try:
                return Host.parse(text)
            except ValueError as exc:
                raise self.error((*where, "host"), f"{exc} or a [hosts] name") from None
        if text in hosts:
            return Host.from_config(hosts[text])
        known = sorted(n for n in hosts if n != "local")
        raise self.error((*where, "host"), f"unknown host {text!r}: expected 'local', "
                         f"'ssh://[user@]host[:port]' or the name of a [hosts] table (known: {known})")

    def logs(self, raw: Any, where: KeyPath) -> LogSpec:
        raw = self.table(raw, where, '{ unit = "sglang-prefill.service" }')
        self.only(raw, where, LOG_KINDS, "log source")
        given = [k for k in LOG_KINDS if k in raw]
        journal = [k for k in given if k in ("journal_file", "journal_dir")]
        if journal and "unit" in given:
            # A journal file or folder holds many units: ``unit`` then filters it (journalctl -u).
            given.remove("unit")
            if len(given) == 1:
                return LogSpec(journal[0], self.get(raw, where, journal[0], str), unit=self.get(raw, where, "unit", str))
        if len(given) != 1:
            got = "none" if not given else f"{len(given)}: {', '.join(given)}"
            raise self.error(where, f"give exactly one log source ({', '.join(LOG_KINDS)}), got {got}")
        kind = given[0]
        if kind != "command":
            return LogSpec(kind, self.get(raw, where, kind, str))
        argv = raw["command"]
        if not isinstance(argv, list) or not argv:
            raise self.error((*where, "command"), "expected a non-empty list of strings (an argv such as "
                             f"[\"docker\", \"logs\", \"c\"], never a shell line), got {type(argv).__name__} {argv!r}")
        for i, arg in enumerate(argv):
            if not isinstance(arg, str):
                raise self.error((*where, "command", i), f"expected str, got {type(arg).__name__} {arg!r}")
        if not argv[0].strip():
            raise self.error((*where, "command", 0), "the program name is empty")
        return LogSpec("command", tuple(argv))

    def process(self, raw: Any, where: KeyPath) -> str | ProcessSelector | None:
        if raw is None:
            return None
        if isinstance(raw, str):
            if not raw.strip():
                raise self.error(where, "expected a non-empty process title")
            return raw
        if not isinstance(raw, dict):
            raise self.error(where, f"expected a process title (str) or a table like {{ title = \"sglang::scheduler\""
                             f" }}, got {type(raw).__name__} {raw!r}")
        self.only(raw, where, PROCESS_KEYS)
        if not raw:
            raise self.error(where, f"give at least one of {', '.join(PROCESS_KEYS)}")
        try:
            return ProcessSelector(**{k: self.get(raw, where, k, str) for k in PROCESS_KEYS})
        except ValueError:  # every given criterion empty
            raise self.error(where, f"give at least one non-empty {', '.join(PROCESS_KEYS)}") from None

    def unique_names(self, engines: list[Engine]) -> None:
        seen: dict[str, int] = {}
        counts: dict[str, int] = {}
        for i, engine in enumerate(engines):
            n = counts.get(engine.role, 0)
            counts[engine.role] = n + 1
            name = engine.name or default_name(engine.role, n)
            if name in seen:
                first = seen[name]
                first_line = self.line(("engine", first, "name"))
                where = f" (line {first_line})" if first_line else ""
                raise self.error(("engine", i, "name"), f"name {name!r} is already the name of engine[{first}]"
                                 f"{where}; engine names must be unique")
            seen[name] = i

    # -- [twin] ------------------------------------------------------------------------------------

    def twin(self, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.error(("twin",), "[twin] must be a table")
        if not raw:
            return raw
        from dataclasses import fields

        from forensics.inventory.twin_table import TwinSettings

        self.only(raw, ("twin",), tuple(f.name for f in fields(TwinSettings)))
        try:
            TwinSettings.check(raw)
        except ValueError as exc:
            key, _, what = str(exc).partition(": ")
            if key.startswith("twin.") and what:
                raise self.error(tuple(key.split(".")), what) from None
            raise InventoryError(f"{self.path}: {exc}", file=str(self.path)) from None
        return raw
