"""What an inventory describes: the deployment, its engines, their hosts, log sources and processes.

Plain frozen dataclasses; ``forensics.inventory.load`` builds them from TOML and checks every
key, ``to_dict`` turns them back into the same TOML (``forensics.inventory.dump``).
"""

from __future__ import annotations

import json
import shlex
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from .errors import InventoryError
from .host_spec import DEFAULT_JOURNALCTL, DEFAULT_PY_SPY, Host, HostConfig
from .hosts import HostFactory

if TYPE_CHECKING:  # pragma: no cover
    from forensics.hosts import Host as CommandHost

ROLES = ("prefill", "decode", "router")
BACKENDS = ("nixl", "mooncake", "mori", "ascend", "fake")
LOG_KINDS = ("unit", "file", "command", "journal_file", "journal_dir")
@dataclass(frozen=True)
class LogSpec:
    """Where an engine's log is read: a systemd unit, a file, a command's output or a journal.

    ``value`` is a string, or for ``command`` an argv tuple (never a shell line).
    """

    kind: str  # one of LOG_KINDS
    value: str | tuple[str, ...]
    unit: str | None = None  # journal_file / journal_dir only: read this unit's entries (journalctl -u)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {self.kind: list(self.value) if isinstance(self.value, tuple) else self.value}
        if self.unit is not None:
            data["unit"] = self.unit
        return data


@dataclass(frozen=True)
class ProcessSelector:
    """Which processes are an engine's: all the given criteria must hold.

    ``title``: the process title starts with it (``sglang::scheduler`` matches the
    ``sglang::scheduler_TP0`` sglang sets with setproctitle), or the kernel's 15-character
    name equals it; ``cmdline``: a substring of the command line joined by spaces;
    ``pid_file``: the pid written in this file on the host; ``pid``: exactly this pid (to
    find a known process again; never in an inventory file). The inventory's ``process``
    table and :func:`forensics.collectors.processes.find_processes` share this one class.
    """

    title: str | None = None
    cmdline: str | None = None
    pid_file: str | None = None
    pid: int | None = None

    def __post_init__(self) -> None:
        if not (self.title or self.cmdline or self.pid_file or self.pid):
            raise ValueError("ProcessSelector needs a title, a cmdline substring, a pid_file or a pid")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        return " ".join(f"{k}={v!r}" for k, v in asdict(self).items() if v is not None)

    def script_argument(self) -> str:
        """The selector as the one argument the process lookup script reads on the host: its
        fields as JSON, hex-encoded, so no shell or quoting on the way can change it."""
        return json.dumps(asdict(self)).encode().hex()


@dataclass(frozen=True)
class Engine:
    """One engine of the deployment and everything needed to observe and restart it.

    ``log_file``/``unit`` and a ``process`` string are the older spellings of ``logs`` and a
    ``process`` table; ``log_source`` and ``selector`` read either. Whichever spelling the file
    uses, ``unit``/``log_file`` hold a unit or file source, ``process`` the title and
    ``pid_file`` the pid file, so code reading those fields keeps working.
    """

    role: str
    host: Host
    url: str
    python: str | None = None
    sglang_location: str | None = None
    sglang: str | None = None  # this engine's release, when it differs from the deployment's (an upgrade)
    bootstrap_port: int | None = None
    log_file: str | None = None
    unit: str | None = None
    stderr_file: str | None = None
    process: str | None = None  # the process title (both spellings)
    pid_file: str | None = None  # both spellings
    restart: str | None = None
    name: str | None = None  # filled in by Inventory: <role>-<n> when not given
    logs: LogSpec | None = None  # the new spelling; unit/log_file mirror a unit/file source
    process_cmdline: str | None = None
    process_table: bool = field(default=False, compare=False)  # written as process = { ... }

    @property
    def bootstrap_url(self) -> str | None:
        if self.bootstrap_port is None:
            return None
        return f"http://{urlparse(self.url).hostname}:{self.bootstrap_port}"

    @property
    def port(self) -> int:
        return urlparse(self.url).port or 80

    @property
    def log_source(self) -> LogSpec | None:
        if self.logs is not None:
            return self.logs
        if self.unit:
            return LogSpec("unit", self.unit)
        if self.log_file:
            return LogSpec("file", self.log_file)
        return None

    @property
    def selector(self) -> ProcessSelector | None:
        if self.process or self.process_cmdline or self.pid_file:
            return ProcessSelector(title=self.process, cmdline=self.process_cmdline, pid_file=self.pid_file)
        return None

    @property
    def sudo(self) -> bool:
        return self.host.config.sudo if self.host.config else False

    @property
    def py_spy(self) -> str:
        return self.host.config.py_spy if self.host.config else DEFAULT_PY_SPY

    @property
    def journalctl(self) -> str:
        return self.host.config.journalctl if self.host.config else DEFAULT_JOURNALCTL

    @property
    def label(self) -> str:
        """For messages: ``prefill-0 (ssh://ops@10.0.3.17:22)``."""
        return f"{self.name or self.role} ({self.host})"

    def to_dict(self) -> dict[str, Any]:
        """The engine table, in the spelling it was read in."""
        skip = {"host", "name", "logs", "process", "pid_file", "process_cmdline", "process_table"}
        if self.logs is not None:
            skip |= {"unit", "log_file"}  # they mirror ``logs``
        data = {k: v for k, v in asdict(self).items() if v is not None and k not in skip}
        data["host"] = self.host.ref
        if self.name is not None:
            data["name"] = self.name
        if self.logs is not None:
            data["logs"] = self.logs.to_dict()
        if self.process_table or self.process_cmdline:
            selector = self.selector
            if selector is not None:
                data["process"] = selector.to_dict()
        else:
            if self.process is not None:
                data["process"] = self.process
            if self.pid_file is not None:
                data["pid_file"] = self.pid_file
        return data


def restart_argv(line: str) -> list[str]:
    """An engine's ``restart`` line as an argument list; ``sudo`` gets ``-n`` (fail, never prompt)."""
    argv = shlex.split(line)
    if argv and argv[0] in ("sudo", "/usr/bin/sudo") and "-n" not in argv[1:2]:
        argv = [argv[0], "-n", *argv[1:]]
    return argv


def default_name(role: str, n: int) -> str:
    return f"{role}-{n}"


@dataclass(frozen=True)
class Inventory:
    """A deployment: name, release, backend, engines, SSH hosts, Prometheus (and ``twin`` settings)."""

    name: str
    engines: tuple[Engine, ...]
    sglang: str | None = None
    backend: str | None = None
    twin: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    hosts: dict[str, HostConfig] = field(default_factory=dict)
    prometheus: str | None = None
    _host_cache: dict[Any, CommandHost] = field(default_factory=dict, init=False, compare=False, repr=False)
    _host_lock: threading.Lock = field(default_factory=threading.Lock, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        counts: dict[str, int] = {}
        named = []
        for engine in self.engines:
            n = counts.get(engine.role, 0)
            counts[engine.role] = n + 1
            named.append(engine if engine.name else replace(engine, name=default_name(engine.role, n)))
        object.__setattr__(self, "engines", tuple(named))

    def engine(self, role: str) -> Engine:
        """The first engine of ``role``."""
        found = self.engines_with(role)
        if found:
            return found[0]
        where = self.path or "inventory"
        raise InventoryError(f"{where}: no [[engine]] with role = {role!r} (has: {self.roles()})")

    def engines_with(self, role: str) -> list[Engine]:
        return [e for e in self.engines if e.role == role]

    def engine_named(self, name: str) -> Engine:
        for engine in self.engines:
            if engine.name == name:
                return engine
        where = self.path or "inventory"
        raise InventoryError(f"{where}: no [[engine]] named {name!r} (has: {[e.name for e in self.engines]})")

    def roles(self) -> list[str]:
        return [e.role for e in self.engines]

    @property
    def is_twin(self) -> bool:
        return bool(self.twin)

    def host_for(self, engine: Engine | str) -> CommandHost:
        """The ``forensics.hosts.Host`` that runs commands where ``engine`` (or the engine named so) runs.

        One object per host for the life of this Inventory (an SSH connection is reused);
        ``close_hosts()`` closes them all.
        """
        if isinstance(engine, str):
            engine = self.engine_named(engine)
        with self._host_lock:
            return HostFactory(self.hosts, self._host_cache).for_host(engine.host)

    def close_hosts(self) -> None:
        with self._host_lock:
            hosts = list(self._host_cache.values())
            self._host_cache.clear()
        for host in hosts:
            host.close()

    def to_dict(self) -> dict[str, Any]:
        deployment: dict[str, Any] = {"name": self.name}
        if self.sglang:
            deployment["sglang"] = self.sglang
        if self.backend:
            deployment["backend"] = self.backend
        if self.prometheus:
            deployment["prometheus"] = self.prometheus
        data: dict[str, Any] = {"deployment": deployment}
        if self.hosts:
            data["hosts"] = {name: config.to_dict() for name, config in self.hosts.items()}
        counts: dict[str, int] = {}
        engines = []
        for engine in self.engines:
            n = counts.get(engine.role, 0)
            counts[engine.role] = n + 1
            entry = engine.to_dict()
            if entry.get("name") == default_name(engine.role, n):
                del entry["name"]  # the default: leave the file as it was written
            engines.append(entry)
        data["engine"] = engines
        if self.twin:
            data["twin"] = dict(self.twin)
        return data
