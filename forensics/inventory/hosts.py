"""From an engine's ``Host`` description to a ``forensics.hosts.Host`` that runs commands there.

``LocalHost`` for ``local``; ``SSHHost`` for a ``[hosts.NAME]`` table (address, user, port,
identity file, known_hosts, ssh_config, connect timeout and a jump host, itself a table or an
``ssh://`` URL that borrows the table's key, known_hosts, ssh_config and timeout) or for an ``ssh://user@host:port`` URL (then ``~/.ssh/config`` and
``~/.ssh/known_hosts`` fill in the rest). Host keys are always checked (``SSHHost``'s default);
no password is ever involved. Objects are cached by the caller's dict: one per host name.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .host_spec import Host, HostConfig

if TYPE_CHECKING:  # pragma: no cover
    from forensics.hosts import Host as CommandHost
    from forensics.hosts import SSHHost


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path is not None else None


class HostFactory:
    """Builds (and caches in ``cache``) the command hosts of one inventory's ``[hosts]`` tables."""

    def __init__(self, tables: dict[str, HostConfig], cache: dict[Any, CommandHost]) -> None:
        self.tables = tables
        self.cache = cache

    def for_host(self, host: Host) -> CommandHost:
        if host.kind == "local":
            return self._cached("local", self._local)
        if host.name is not None and host.config is not None:
            return self._cached(("hosts", host.name), lambda: self._from_table(host.config))
        return self._cached(("url", str(host)), lambda: self._from_url(host, None))

    def _cached(self, key: Any, build) -> CommandHost:
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    @staticmethod
    def _local() -> CommandHost:
        from forensics.hosts import LocalHost

        return LocalHost()

    def _from_table(self, config: HostConfig) -> SSHHost:
        from forensics.hosts import SSHHost

        kwargs: dict[str, Any] = {"user": config.user, "port": config.port, "name": config.name}
        if config.key is not None:
            kwargs["key_filename"] = _expand(config.key)
        if config.known_hosts is not None:
            kwargs["known_hosts"] = _expand(config.known_hosts)
        if config.ssh_config is not None:
            kwargs["ssh_config"] = _expand(config.ssh_config)
        if config.connect_timeout is not None:
            kwargs["connect_timeout"] = float(config.connect_timeout)
        if config.jump is not None:
            kwargs["jump"] = self._jump(config)
        return SSHHost(config.address, **kwargs)

    def _jump(self, config: HostConfig) -> SSHHost:
        assert config.jump is not None
        if config.jump.startswith("ssh://"):
            hop = Host.parse(config.jump)
            key = ("jump", str(hop), config.key, config.known_hosts, config.ssh_config, config.connect_timeout)
            return self._cached(key, lambda: self._from_url(hop, config))
        return self._cached(("hosts", config.jump), lambda: self._from_table(self.tables[config.jump]))

    @staticmethod
    def _from_url(host: Host, via: HostConfig | None) -> SSHHost:
        """An ``ssh://`` target; a jump URL inherits key, known_hosts, ssh_config and timeout of ``via``."""
        from forensics.hosts import SSHHost

        kwargs: dict[str, Any] = {"user": host.user, "port": host.port}
        if via is not None:
            if via.key is not None:
                kwargs["key_filename"] = _expand(via.key)
            if via.known_hosts is not None:
                kwargs["known_hosts"] = _expand(via.known_hosts)
            if via.ssh_config is not None:
                kwargs["ssh_config"] = _expand(via.ssh_config)
            if via.connect_timeout is not None:
                kwargs["connect_timeout"] = float(via.connect_timeout)
        return SSHHost(host.hostname, **kwargs)
