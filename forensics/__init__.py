"""PD Forensics: find, prove, fix and verify wedged sglang prefill/decode engines.

``import forensics as fx`` stays light: sub-modules (logs, the twin, NIXL, libcst,
plotting) load on first attribute access, so a notebook or the CLI pays only for
what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public sub-modules, imported lazily on first access (``fx.logs.timeline(...)``).
_LAZY_SUBMODULES = {
    "logs",
    "sglang_source",
    "sandbox",
    "handlers",
    "twin",
    "cache",
    "exitcodes",
    "hosts",
    "collectors",
    "inventory",
    "probes",
    "threads",
    "evidence",
    "collection",
    "bundle",
    "diagnosis",
    "redact",
    "patch",  # fx.patch.diff/apply/verify/deploy/status/rollback: facade over patched_engine
    "report",
    "demo",  # fx.demo.run(...): the whole story on a twin, as `forensics demo` runs it
    "storm",  # fx.storm.run_storm(...): a function named like the package would be replaced by it on import
    "upgrade",  # fx.upgrade.plan_upgrade("0.5.15", "0.5.16"): prefills or decodes first
    "readiness",  # fx.readiness.check("inventory.toml"): hosts, URLs, journals, py-spy (forensics init)
}

# Public functions, imported lazily from their modules on first access (``fx.diagnose(...)``).
_LAZY_FUNCTIONS = {
    "collect": ("forensics.collection", "collect"),
    "diagnose": ("forensics.diagnosing", "diagnose"),
    "watch": ("forensics.watching", "watch"),
    "validate": ("forensics.validation", "validate"),
    "Investigation": ("forensics.report", "Investigation"),
}

if TYPE_CHECKING:  # pragma: no cover
    from . import cache, exitcodes, logs, sglang_source  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name in _LAZY_FUNCTIONS:
        module_name, attribute = _LAZY_FUNCTIONS[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forensics' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES | set(_LAZY_FUNCTIONS))
