"""How an inventory names a host: the ``[hosts.NAME]`` tables and an engine's ``host`` (``local``,
a table's name or ``ssh://user@host:port``). Plain frozen dataclasses, below both the inventory's
model (whose engines hold them) and :mod:`forensics.inventory.hosts` (which turns them into
command hosts).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_PY_SPY = "py-spy"
DEFAULT_JOURNALCTL = "journalctl"

_HOST_RE = re.compile(r"^ssh://(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^:/@]+)(?::(?P<port>\d+))?/?$")


@dataclass(frozen=True)
class HostConfig:
    """One ``[hosts.NAME]`` table: how to reach an SSH host and how to run tools there.

    ``[hosts.local]`` may set ``sudo``, ``py_spy`` and ``journalctl`` for engines on this machine.
    """

    name: str
    address: str
    user: str | None = None
    port: int | None = None
    key: str | None = None  # identity file; ~ expanded when used
    jump: str | None = None  # another [hosts] name, or ssh://user@host:port
    sudo: bool = False
    known_hosts: str | None = None
    ssh_config: str | None = None
    py_spy: str = DEFAULT_PY_SPY
    journalctl: str = DEFAULT_JOURNALCTL
    connect_timeout: float | None = None

    @property
    def is_local(self) -> bool:
        return self.name == "local"

    def to_dict(self) -> dict[str, Any]:
        defaults = HostConfig(self.name, self.name)
        return {k: v for k, v in asdict(self).items()
                if k != "name" and v is not None and v != getattr(defaults, k)}


@dataclass(frozen=True)
class Host:
    """Where an engine runs: this machine ("local") or an SSH target (a URL or a [hosts] table)."""

    kind: str  # "local" or "ssh"
    hostname: str = "localhost"
    user: str | None = None
    port: int = 22
    name: str | None = None  # the [hosts] table it comes from, if any
    config: HostConfig | None = None

    @classmethod
    def parse(cls, text: str) -> Host:
        if text == "local":
            return cls("local")
        match = _HOST_RE.match(text)
        if not match:
            raise ValueError(f"expected 'local' or 'ssh://[user@]host[:port]', got {text!r}")
        return cls("ssh", match["host"].strip("[]"), match["user"], int(match["port"] or 22))

    @classmethod
    def from_config(cls, config: HostConfig) -> Host:
        if config.is_local:
            return cls("local", name="local", config=config)
        return cls("ssh", config.address, config.user, config.port or 22, name=config.name, config=config)

    @property
    def ref(self) -> str:
        """How an engine names this host in the file: ``local``, a [hosts] name or the URL."""
        if self.kind == "local":
            return "local"
        return self.name or str(self)

    def __str__(self) -> str:
        if self.kind == "local":
            return "local"
        user = f"{self.user}@" if self.user else ""
        hostname = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"ssh://{user}{hostname}:{self.port}"
