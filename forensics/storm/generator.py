"""The storm's generator: N concurrent streaming chat completions through the router, in waves.

Each session carries its own ``rid`` (sglang and the twin take a ``rid`` field in the body
and log it in the decode's failure lines), so its fate can be found in the logs afterwards.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from urllib.parse import urlparse

from forensics.exitcodes import UsageProblem

ENDPOINT = "/v1/chat/completions"
WORD = "tok "  # one token per word for a BPE tokenizer, one per 4 bytes for the twin's count
CHAT_OVERHEAD_TOKENS = 4  # the twin's chat-template estimate per message


@dataclass(frozen=True)
class SessionSpec:
    cycle: int
    wave: int
    session: int
    rid: str
    prompt_tokens: int
    max_tokens: int

    def body(self) -> dict:
        words = max(1, self.prompt_tokens - CHAT_OVERHEAD_TOKENS)
        return {"model": "default", "messages": [{"role": "user", "content": WORD * words}],
                "max_tokens": self.max_tokens, "stream": True, "rid": self.rid}


def storm_id() -> str:
    return secrets.token_hex(4)


def plan_sessions(sessions: int, *, cycle: int, storm: str, prompt_tokens: int, max_tokens: int,
                  waves: int = 1) -> list[SessionSpec]:
    """``sessions`` sessions split into ``waves`` waves as evenly as possible, each with its own rid."""
    check_sizes(sessions, prompt_tokens, max_tokens, waves)
    specs = []
    for index in range(sessions):
        wave = index * waves // sessions
        specs.append(SessionSpec(cycle=cycle, wave=wave, session=index,
                                 rid=f"storm-{storm}-c{cycle}-s{index}", prompt_tokens=prompt_tokens,
                                 max_tokens=max_tokens))
    return specs


def check_sizes(sessions: int, prompt_tokens: int, max_tokens: int, waves: int) -> None:
    for name, value in (("sessions", sessions), ("prompt tokens", prompt_tokens), ("max tokens", max_tokens),
                        ("waves", waves)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageProblem(f"{name}: expected a positive integer, got {value!r}")
    if waves > sessions:
        raise UsageProblem(f"waves ({waves}) cannot exceed sessions ({sessions})")


def router_address(url: str) -> tuple[str, int]:
    """(host, port) of the router URL (plain http only: the storm writes raw HTTP/1.1)."""
    parsed = urlparse(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise UsageProblem(f"router url {url!r}: the storm speaks plain http://host:port")
    return parsed.hostname, parsed.port or 80
