"""The inventory: one TOML file describing a PD deployment, live or twin.

The same format describes a production deployment (hosts over SSH, systemd units)
and a twin (three local processes), so every later tool treats both alike::

    [deployment]
    name = "pd-prod-7"
    sglang = "0.5.15"
    backend = "nixl"

    [[engine]]
    role = "prefill"                      # prefill | decode | router
    host = "ssh://ops@pd-prefill-0:22"    # or "local"
    url = "http://10.0.3.17:30000"
    bootstrap_port = 8998                 # prefill only
    unit = "sglang-prefill.service"       # or log_file = "/var/log/sglang/prefill.log"
    process = "sglang::scheduler"         # process title to look for (py-spy, psutil)
    pid_file = "/run/sglang/prefill.pid"  # optional, exact pid
    python = "/opt/sglang/.venv/bin/python"
    sglang_location = "/opt/sglang/.venv/lib/python3.11/site-packages"
    restart = "systemctl restart sglang-prefill.service"

A twin adds a ``[twin]`` table with its own settings (directory, rates, timeouts);
live deployments leave it out. Loading validates every key and names the file and
key in the error.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import tomli_w

from forensics.exitcodes import EnvironmentProblem

ROLES = ("prefill", "decode", "router")
BACKENDS = ("nixl", "mooncake", "mori", "ascend", "fake")
_HOST_RE = re.compile(r"^ssh://(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^:/@]+)(?::(?P<port>\d+))?/?$")


class InventoryError(EnvironmentProblem):
    """An inventory file is missing, unreadable or invalid; the message names file and key."""


@dataclass(frozen=True)
class Host:
    """Where an engine runs: this machine ("local") or an SSH target."""

    kind: str  # "local" or "ssh"
    hostname: str = "localhost"
    user: str | None = None
    port: int = 22

    @classmethod
    def parse(cls, text: str) -> Host:
        if text == "local":
            return cls("local")
        match = _HOST_RE.match(text)
        if not match:
            raise ValueError(f"expected 'local' or 'ssh://[user@]host[:port]', got {text!r}")
        return cls("ssh", match["host"].strip("[]"), match["user"], int(match["port"] or 22))

    def __str__(self) -> str:
        if self.kind == "local":
            return "local"
        user = f"{self.user}@" if self.user else ""
        return f"ssh://{user}{self.hostname}:{self.port}"


@dataclass(frozen=True)
class Engine:
    """One role of the deployment and everything needed to observe and restart it."""

    role: str
    host: Host
    url: str
    python: str | None = None
    sglang_location: str | None = None
    bootstrap_port: int | None = None
    log_file: str | None = None
    unit: str | None = None
    stderr_file: str | None = None
    process: str | None = None
    pid_file: str | None = None
    restart: str | None = None

    @property
    def bootstrap_url(self) -> str | None:
        if self.bootstrap_port is None:
            return None
        return f"http://{urlparse(self.url).hostname}:{self.bootstrap_port}"

    @property
    def port(self) -> int:
        return urlparse(self.url).port or 80

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v is not None}
        data["host"] = str(self.host)
        return data


@dataclass(frozen=True)
class Inventory:
    """A deployment: its name, release, backend and engines (plus ``twin`` settings for a twin)."""

    name: str
    engines: tuple[Engine, ...]
    sglang: str | None = None
    backend: str | None = None
    twin: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def engine(self, role: str) -> Engine:
        for engine in self.engines:
            if engine.role == role:
                return engine
        where = self.path or "inventory"
        raise InventoryError(f"{where}: no [[engine]] with role = {role!r} (has: {[e.role for e in self.engines]})")

    def roles(self) -> list[str]:
        return [e.role for e in self.engines]

    @property
    def is_twin(self) -> bool:
        return bool(self.twin)

    def to_dict(self) -> dict[str, Any]:
        deployment: dict[str, Any] = {"name": self.name}
        if self.sglang:
            deployment["sglang"] = self.sglang
        if self.backend:
            deployment["backend"] = self.backend
        data: dict[str, Any] = {"deployment": deployment, "engine": [e.to_dict() for e in self.engines]}
        if self.twin:
            data["twin"] = dict(self.twin)
        return data


def dump(inventory: Inventory, path: str | Path) -> Path:
    """Write ``inventory`` as TOML (atomically: a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tomli_w.dumps(inventory.to_dict()))
    tmp.replace(path)
    return path


def load(path: str | Path) -> Inventory:
    """Read and validate an inventory file; errors name the file and the offending key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InventoryError(f"{path}: no such inventory file") from exc
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        line = text_line(path, exc.start)
        raise InventoryError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
                             f"{f', line {line}' if line else ''})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{path}: not valid TOML ({exc})") from exc
    return parse(data, path)


def text_line(path: Path, offset: int) -> int | None:
    """The 1-based line of byte ``offset`` in ``path`` (for errors)."""
    try:
        return path.read_bytes()[:offset].count(b"\n") + 1
    except OSError:
        return None


def parse(data: dict[str, Any], path: str | Path = "<inventory>") -> Inventory:
    """Validate a decoded inventory document (see the module docstring for the format)."""
    deployment = data.get("deployment")
    if not isinstance(deployment, dict):
        raise InventoryError(f"{path}: missing [deployment] table")
    name = _field(deployment, "name", str, f"{path}: deployment.name", required=True)
    sglang = _field(deployment, "sglang", str, f"{path}: deployment.sglang")
    backend = _field(deployment, "backend", str, f"{path}: deployment.backend")
    if backend is not None and backend not in BACKENDS:
        raise InventoryError(f"{path}: deployment.backend: expected one of {BACKENDS}, got {backend!r}")
    raw_engines = data.get("engine")
    if not isinstance(raw_engines, list) or not raw_engines:
        raise InventoryError(f"{path}: needs at least one [[engine]] table")
    engines = []
    for index, raw in enumerate(raw_engines):
        engines.append(_parse_engine(raw, f"{path}: engine[{index}]"))
    roles = [e.role for e in engines]
    for role in ("prefill", "decode"):
        if role not in roles:
            raise InventoryError(f"{path}: no [[engine]] with role = {role!r}")
    twin = data.get("twin", {})
    if not isinstance(twin, dict):
        raise InventoryError(f"{path}: [twin] must be a table")
    if twin:
        from forensics.twin.settings import TwinSettings

        try:
            TwinSettings.check(twin)
        except ValueError as exc:
            raise InventoryError(f"{path}: {exc}") from None
    known = {"deployment", "engine", "twin"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InventoryError(f"{path}: unknown top-level key(s) {unknown} (expected {sorted(known)})")
    return Inventory(name=name, engines=tuple(engines), sglang=sglang, backend=backend, twin=twin,
                     path=Path(path) if not str(path).startswith("<") else None)


_ENGINE_KEYS = {
    "role", "host", "url", "python", "sglang_location", "bootstrap_port", "log_file", "unit",
    "stderr_file", "process", "pid_file", "restart",
}


def _parse_engine(raw: Any, where: str) -> Engine:
    if not isinstance(raw, dict):
        raise InventoryError(f"{where}: must be a table")
    unknown = sorted(set(raw) - _ENGINE_KEYS)
    if unknown:
        raise InventoryError(f"{where}: unknown key(s) {unknown} (allowed: {sorted(_ENGINE_KEYS)})")
    role = _field(raw, "role", str, f"{where}.role", required=True)
    if role not in ROLES:
        raise InventoryError(f"{where}.role: expected one of {ROLES}, got {role!r}")
    host_text = _field(raw, "host", str, f"{where}.host", required=True)
    try:
        host = Host.parse(host_text)
    except ValueError as exc:
        raise InventoryError(f"{where}.host: {exc}") from None
    url = _field(raw, "url", str, f"{where}.url", required=True)
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InventoryError(f"{where}.url: expected http(s)://host[:port], got {url!r}")
    bootstrap_port = _field(raw, "bootstrap_port", int, f"{where}.bootstrap_port")
    if bootstrap_port is not None and not 0 < bootstrap_port < 65536:
        raise InventoryError(f"{where}.bootstrap_port: {bootstrap_port} is not a TCP port")
    if role == "prefill" and bootstrap_port is None:
        raise InventoryError(f"{where}.bootstrap_port: required for the prefill role")
    log_file = _field(raw, "log_file", str, f"{where}.log_file")
    unit = _field(raw, "unit", str, f"{where}.unit")
    if log_file and unit:
        raise InventoryError(f"{where}: give either log_file or unit as the log source, not both")
    return Engine(
        role=role, host=host, url=url.rstrip("/"), bootstrap_port=bootstrap_port,
        python=_field(raw, "python", str, f"{where}.python"),
        sglang_location=_field(raw, "sglang_location", str, f"{where}.sglang_location"),
        log_file=log_file, unit=unit,
        stderr_file=_field(raw, "stderr_file", str, f"{where}.stderr_file"),
        process=_field(raw, "process", str, f"{where}.process"),
        pid_file=_field(raw, "pid_file", str, f"{where}.pid_file"),
        restart=_field(raw, "restart", str, f"{where}.restart"),
    )


def _field(table: dict[str, Any], key: str, kind: type, where: str, *, required: bool = False) -> Any:
    if key not in table:
        if required:
            raise InventoryError(f"{where}: missing (required)")
        return None
    value = table[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise InventoryError(f"{where}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value
