"""What gets probed: a :class:`Target` per engine, plus the real request path for liveness.

From an inventory (anything with ``.engines``, each with ``role``, ``url``, ``bootstrap_port``
and perhaps ``name``) or a twin (anything with ``.inventory``):

* every engine (prefill, decode, router) is probed with ``health`` and ``health_generate``;
* ``liveness`` goes through the router when the deployment has one; without a router it
  goes to each prefill+decode pair directly, as sglang's routers send it (role ``pd``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from forensics.probes.schema import KINDS

SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998  # --disaggregation-bootstrap-port
ENGINE_KINDS = ("health", "health_generate")


@dataclass(frozen=True)
class Target:
    """One thing to probe.

    ``role`` is ``prefill``, ``decode``, ``router`` or ``pd``. A ``pd`` target is a prefill and
    a decode probed together for liveness without a router: ``url`` is the prefill's,
    ``decode_url`` the decode's and ``bootstrap_port`` the prefill's bootstrap port.
    ``kinds`` defaults by role: engines get the two health kinds, a router all three, a pair
    only liveness.
    """

    name: str
    role: str
    url: str
    bootstrap_port: int | None = None
    decode_url: str | None = None
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.decode_url is not None:
            object.__setattr__(self, "decode_url", self.decode_url.rstrip("/"))
        if self.role == "pd" and not self.decode_url:
            raise ValueError(f"target {self.name!r}: a pd pair needs decode_url")
        if self.kinds is None:
            default = {"router": KINDS, "pd": ("liveness",)}.get(self.role, ENGINE_KINDS)
            object.__setattr__(self, "kinds", tuple(default))
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"target {self.name!r}: unknown probe kinds {sorted(unknown)} (known: {KINDS})")

    @property
    def bootstrap_host(self) -> str:
        """The prefill URL's hostname, IPv6 in brackets (what sglang's routers put in the body)."""
        host = urlsplit(self.url).hostname or ""
        return f"[{host}]" if ":" in host else host


def _engines(source: Any) -> list[Any]:
    if hasattr(source, "engines"):
        return list(source.engines)
    inventory = getattr(source, "inventory", None)
    if inventory is not None and hasattr(inventory, "engines"):
        return list(inventory.engines)
    raise TypeError(f"cannot find engines in {type(source).__name__}: expected an inventory (with .engines), "
                    "a deployment (with .inventory) or a list of Target")


def targets_from(source: Any) -> list[Target]:
    """The targets of a deployment: inventory, twin deployment, or an iterable of :class:`Target`."""
    if isinstance(source, Target):
        return [source]
    if not hasattr(source, "engines") and not hasattr(source, "inventory") and isinstance(source, Iterable):
        items = list(source)
        if not all(isinstance(t, Target) for t in items):
            raise TypeError("expected Target objects")
        return items
    engines = _engines(source)
    targets: list[Target] = []
    seen: dict[str, int] = {}
    for engine in engines:
        role = engine.role
        name = getattr(engine, "name", None) or role
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:  # two engines with one name (old inventories name them by role)
            name = f"{name}-{seen[name] - 1}"
        kinds = KINDS if role == "router" else ENGINE_KINDS
        targets.append(Target(name, role, engine.url, getattr(engine, "bootstrap_port", None), kinds=kinds))
    if not any(t.role == "router" for t in targets):
        prefills = [t for t in targets if t.role == "prefill"]
        decodes = [t for t in targets if t.role == "decode"]
        for p in prefills:
            for d in decodes:
                port = p.bootstrap_port if p.bootstrap_port is not None else SGLANG_DEFAULT_BOOTSTRAP_PORT
                targets.append(Target(f"{p.name}+{d.name}", "pd", p.url, port, decode_url=d.url,
                                      kinds=("liveness",)))
    return targets
