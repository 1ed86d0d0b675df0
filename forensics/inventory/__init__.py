"""The inventory: one TOML file describing a PD deployment, live or twin (``docs/inventory.md``).

    import forensics.inventory as inventory
    inv = inventory.load("docs/examples/pd-two-node.toml")
    for engine in inv.engines_with("decode"):
        host = inv.host_for(engine)                 # LocalHost or SSHHost, one per [hosts] name
        host.run([engine.journalctl, "-u", engine.log_source.value], sudo=engine.sudo)
    inv.close_hosts()

Modules: ``model`` (the dataclasses), ``load`` (reading, checking, writing), ``locate`` (the line
of a key path, for errors), ``hosts`` (command hosts from [hosts] tables), ``errors``.
"""

from __future__ import annotations

from .errors import InventoryError
from .host_spec import Host, HostConfig
from .load import dump, load, loads, parse, text_line
from .locate import Locator, format_path
from .model import (
    BACKENDS,
    LOG_KINDS,
    ROLES,
    Engine,
    Inventory,
    LogSpec,
    ProcessSelector,
)

__all__ = [
    "BACKENDS",
    "LOG_KINDS",
    "ROLES",
    "Engine",
    "Host",
    "HostConfig",
    "Inventory",
    "InventoryError",
    "Locator",
    "LogSpec",
    "ProcessSelector",
    "dump",
    "format_path",
    "load",
    "loads",
    "parse",
    "text_line",
]
