"""Engine sandbox: run a release's REAL sglang disaggregation code on this CPU.

Two layers:

* in-process, for the twin's prefill process: :func:`load_release` (the import shim),
  :class:`PrefillLoop` (the release's prefill KV manager and its own bootstrap thread on a
  real ZMQ PULL socket) and :class:`DecodePeer` (frames built by the release's decode code);
* a fresh interpreter per sandbox, for verification, fuzzing and handler confirmation:
  :class:`EngineSandbox`.

Names load lazily so ``import forensics.sandbox`` stays cheap (no numpy, zmq or NIXL).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forensics.sandbox.errors import SandboxError, UnexpectedImport

_LAZY = {
    "EngineSandbox": "forensics.sandbox.engine",
    "load_release": "forensics.sandbox.shim",
    "LoadedRelease": "forensics.sandbox.shim",
    "PrefillLoop": "forensics.sandbox.prefill",
    "DecodePeer": "forensics.sandbox.decode",
    "STUB_RULES": "forensics.sandbox.stubs",
    "rules_for": "forensics.sandbox.stubs",
    "KVPOLL_NAMES": "forensics.sandbox.snapshot",
    "SandboxSnapshot": "forensics.sandbox.snapshot",
}

__all__ = [
    "KVPOLL_NAMES",
    "STUB_RULES",
    "DecodePeer",
    "EngineSandbox",
    "LoadedRelease",
    "PrefillLoop",
    "SandboxError",
    "SandboxSnapshot",
    "UnexpectedImport",
    "load_release",
    "rules_for",
]

if TYPE_CHECKING:  # pragma: no cover
    from forensics.sandbox.decode import DecodePeer
    from forensics.sandbox.engine import EngineSandbox
    from forensics.sandbox.prefill import PrefillLoop
    from forensics.sandbox.shim import LoadedRelease, load_release
    from forensics.sandbox.snapshot import KVPOLL_NAMES, SandboxSnapshot
    from forensics.sandbox.stubs import STUB_RULES, rules_for


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forensics.sandbox' has no attribute {name!r}")
