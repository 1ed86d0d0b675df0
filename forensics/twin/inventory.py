"""The inventory format now lives in ``forensics.inventory``; this name stays for old imports."""

from __future__ import annotations

from forensics.inventory import (
    BACKENDS,
    LOG_KINDS,
    ROLES,
    Engine,
    Host,
    HostConfig,
    Inventory,
    InventoryError,
    LogSpec,
    ProcessSelector,
    dump,
    load,
    loads,
    parse,
    text_line,
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
    "LogSpec",
    "ProcessSelector",
    "dump",
    "load",
    "loads",
    "parse",
    "text_line",
]
