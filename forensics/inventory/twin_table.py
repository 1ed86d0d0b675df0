"""The twin's own settings, stored in the inventory's ``[twin]`` table.

Every twin process reads them from the inventory alone, so ``twin restart`` and
``twin down --inventory FILE`` need nothing else.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

DEFAULT_WAITING_TIMEOUT_S = 30.0  # sglang: 300 s; shorter so a wedge shows its timeouts in a demo


@dataclass
class TwinSettings:
    directory: str
    sglang: str
    sglang_root: str  # the twin's own copy, laid out like site-packages (holds sglang/)
    # A mixed-version twin (a rolling upgrade): the decode's release and its own copy; empty when
    # the decode runs the prefill's release.
    decode_sglang: str = ""
    decode_sglang_root: str = ""
    backend: str = "nixl"
    patched: bool = False
    host: str = "127.0.0.1"
    router_port: int = 0
    prefill_port: int = 0
    bootstrap_port: int = 0
    decode_port: int = 0
    waiting_timeout_s: float = DEFAULT_WAITING_TIMEOUT_S
    prefill_rate_tps: float = 5000.0  # prefill speed, tokens/s: the window in which a client can die
    decode_rate_tps: float = 20.0  # decode iterations per second (one token per running request each)
    decode_log_interval: int = 40  # sglang's --decode-log-interval
    abort_delay_s: float = 2.0  # sglang's streaming disconnect -> AbortReq delay (create_abort_task)
    bytes_per_token: int = 256  # synthetic KV bytes per prompt token
    page_bytes: int = 4096
    pool_pages: int = 16384  # decode KV pool: 64 MiB at 4 KiB pages
    max_prefill_tokens: int = 16384  # tokens per prefill batch
    health_timeout_s: float = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT
    log_level: str = "info"
    # sglang.srt.disaggregation's DEBUG lines (the decode's "Sent abort notification ...", which the
    # storm counts); a real engine at its default level writes none of them (the fidelity check runs
    # the twin with this off).
    disaggregation_debug: bool = True
    created_directory: bool = False  # the twin made ``directory`` itself: ``twin down`` removes it
    # What runs: "twin" (this project's processes around sglang's bootstrap loop) or "sglang" (the
    # real engine, forensics.engine.deployment). The real engine's own environment (a clone in the
    # cache, holding ``sglang_root``) and the model it serves:
    engine: str = "twin"
    engine_env: str = ""
    model: str = ""
    model_size: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def check(cls, data: dict[str, Any]) -> None:
        """Raise ValueError naming the key (``twin.<key>: ...``) for a missing key or a bad type."""
        for f in fields(cls):
            if f.name not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ValueError(f"twin.{f.name}: missing (required)")
                continue
            value = data[f.name]
            kind = {"str": str, "bool": bool, "int": int, "float": (int, float)}[str(f.type)]
            if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
                expected = "number" if str(f.type) == "float" else str(f.type)
                raise ValueError(f"twin.{f.name}: expected {expected}, got {type(value).__name__} {value!r}")
            if str(f.type) == "float" and not math.isfinite(value):
                raise ValueError(f"twin.{f.name}: expected a finite number, got {value!r}")
            if f.name.endswith("_port") and not 0 <= value < 65536:
                raise ValueError(f"twin.{f.name}: {value} is not a TCP port")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TwinSettings:
        cls.check(data)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def release_of(self, role: str) -> tuple[str, str]:
        """(release, its copy's root) that ``role`` runs: the decode's own when the pair is mixed."""
        if role == "decode" and self.decode_sglang:
            return self.decode_sglang, self.decode_sglang_root
        return self.sglang, self.sglang_root

    def url(self, port: int) -> str:
        return f"http://{self.host}:{port}"
