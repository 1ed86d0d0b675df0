"""Where an SSH target really is: ``~/.ssh/config`` (paramiko's SSHConfig) plus explicit overrides.

paramiko's SSHClient does not read ssh_config by itself; this does, for the options that
decide where and as whom we connect: HostName, User, Port, IdentityFile, ProxyJump.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

DEFAULT_CONFIG = Path("~/.ssh/config")


@dataclass(frozen=True)
class Target:
    alias: str  # what the caller named (a config Host pattern, or a hostname)
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    proxy_jump: tuple[str, ...] = field(default=())  # hops, first one first (as ProxyJump lists them)

    @property
    def label(self) -> str:
        port = "" if self.port == 22 else f":{self.port}"
        return f"{self.user}@{self.hostname}{port}"


def split_spec(spec: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` into its parts (``[v6]:port`` accepted)."""
    text = spec.removeprefix("ssh://").rstrip("/")
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
    port = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p)
    else:
        host = text
    if not host:
        raise ValueError(f"no host in SSH target {spec!r}")
    return user, host, port


def load_config(path: str | os.PathLike[str] | None) -> paramiko.SSHConfig | None:
    """The parsed config file; ``None`` when no path was given and ``~/.ssh/config`` does not exist."""
    if path is None:
        default = DEFAULT_CONFIG.expanduser()
        return paramiko.SSHConfig.from_path(str(default)) if default.is_file() else None
    return paramiko.SSHConfig.from_path(os.fspath(path))


def resolve(
    spec: str,
    config: paramiko.SSHConfig | None,
    *,
    user: str | None = None,
    port: int | None = None,
    identity_files: tuple[str, ...] | None = None,
) -> Target:
    """Explicit arguments win over the spec's ``user@host:port``, which wins over the config file."""
    spec_user, alias, spec_port = split_spec(spec)
    opts = config.lookup(alias) if config is not None else {}
    hostname = opts.get("hostname", alias)
    jump = opts.get("proxyjump")
    hops: tuple[str, ...] = ()
    if jump and jump.strip().lower() != "none":
        hops = tuple(h.strip() for h in jump.split(",") if h.strip())
    files = identity_files if identity_files is not None else tuple(
        os.path.expanduser(f) for f in opts.get("identityfile", [])
    )
    return Target(
        alias=alias,
        hostname=hostname,
        port=int(port or spec_port or opts.get("port", 22)),
        user=user or spec_user or opts.get("user") or getpass.getuser(),
        identity_files=files,
        proxy_jump=hops,
    )
