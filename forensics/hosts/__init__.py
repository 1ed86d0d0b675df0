"""Hosts: where commands run (``LocalHost``, ``SSHHost``) and what they did (``CommandResult``).

    import forensics as fx
    host = fx.hosts.SSHHost("pd-prefill-0")          # ~/.ssh/config, known_hosts, keys/agent
    r = host.run(["journalctl", "-u", "sglang-prefill", "-n", "100"], timeout=30, sudo=True)
    r.state, r.exit_code, r.stdout_text, r.truncated
    fx.hosts.run_many([host, fx.hosts.LocalHost()], ["uptime"])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, CommandStream, Host
from .fanout import iter_many, run_many
from .local import LocalHost
from .quoting import remote_command_line
from .result import CommandResult, State

if TYPE_CHECKING:  # pragma: no cover
    from .hostkeys import ChangedHostKey, HostKeyRefused, UnknownHostKey, fingerprint
    from .ssh import SSHHost

# paramiko (the ``twin`` extra) loads only when an SSH name is first used: LocalHost works without it.
_LAZY = {
    "SSHHost": ".ssh",
    "ChangedHostKey": ".hostkeys",
    "HostKeyRefused": ".hostkeys",
    "UnknownHostKey": ".hostkeys",
    "fingerprint": ".hostkeys",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            module = importlib.import_module(_LAZY[name], __name__)
        except ModuleNotFoundError as exc:
            if exc.name != "paramiko":
                raise
            from ..exitcodes import EnvironmentProblem

            raise EnvironmentProblem(
                f"forensics.hosts.{name} needs paramiko: pip install 'pd-forensics[twin]'"
            ) from None
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forensics.hosts' has no attribute {name!r}")

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_S",
    "ChangedHostKey",
    "CommandResult",
    "CommandStream",
    "Host",
    "HostKeyRefused",
    "LocalHost",
    "SSHHost",
    "State",
    "UnknownHostKey",
    "fingerprint",
    "iter_many",
    "remote_command_line",
    "run_many",
]
