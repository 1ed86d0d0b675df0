"""The storm's drain: before the check, wait (bounded) until every server answers /health 200 again.

Real HTTP servers on 127.0.0.1 stand in for a busy prefill (503, as sglang's own health check
answers while its scheduler computes) and a serving decode; no timer decides, the answers do.
"""

from __future__ import annotations

import threading

from http_helpers import RoutesServer

from forensics.inventory import Engine, Host, Inventory
from forensics.storm import drain


def _inventory(prefill: str, decode: str, twin: dict | None = None) -> Inventory:
    return Inventory(name="t", engines=(Engine(role="prefill", host=Host("local"), url=prefill),
                                        Engine(role="decode", host=Host("local"), url=decode)), twin=twin or {})


def test_the_drain_waits_for_a_busy_prefill_to_answer_200_and_no_longer():
    with RoutesServer({"/health": (503, "busy")}) as prefill, RoutesServer({"/health": (200, "")}) as decode:
        threading.Timer(2.0, lambda: prefill.routes.update({"/health": (200, "")})).start()
        result = drain.wait_until_serving(_inventory(prefill.url, decode.url), cap_s=60)
    assert result.healthy and result.waiting_for == ()
    assert 1.5 <= result.seconds < 30, result
    assert decode.requests == ["/health"]  # a server that answered 200 is not asked again


def test_the_drain_gives_up_at_its_cap_naming_the_server_still_failing():
    with RoutesServer({"/health": (503, "busy")}) as prefill, RoutesServer({"/health": (200, "")}) as decode:
        result = drain.wait_until_serving(_inventory(prefill.url, decode.url), cap_s=2)
    assert not result.healthy and result.waiting_for == ("prefill-0",)  # the engine's name in the inventory
    assert 2 <= result.seconds < 10


def test_the_cap_is_the_recorded_waiting_timeout_else_sglangs_default():
    assert drain.cap_for(_inventory("http://127.0.0.1:9", "http://127.0.0.1:9", {"waiting_timeout_s": 120.0})) == 120
    assert drain.cap_for(_inventory("http://127.0.0.1:9", "http://127.0.0.1:9")) == drain.DEFAULT_CAP_S


def test_the_checks_probe_deadlines_follow_the_slowest_healthy_answer_and_never_go_below_the_default():
    from forensics.probes import DEFAULT_DEADLINES_S

    slow = drain.Drain(seconds=3.0, healthy=True, waiting_for=(), health_s=2.03)
    assert slow.probe_deadlines(None) == {"health": 6.1, "health_generate": 6.1, "liveness": 6.1}
    assert slow.probe_deadlines({"liveness": 30.0, "health": 1.0}) == {"liveness": 30.0, "health": 1.0,
                                                                       "health_generate": 6.1}
    # real 0.5.13 patched right after a storm: the slowest /health took 8.04 s (liveness at 5 s read it as DEGRADED)
    busy = drain.Drain(seconds=9.0, healthy=True, waiting_for=(), health_s=8.042)
    assert busy.probe_deadlines(None)["liveness"] == 24.1
    assert drain.Drain(9.0, True, (), health_s=60.0).probe_deadlines(None)["liveness"] == drain.MAX_HEALTH_DEADLINE_S
    fast = drain.Drain(seconds=0.01, healthy=True, waiting_for=(), health_s=0.004)  # the twin, and a wedged prefill
    assert fast.probe_deadlines(None) == {k: DEFAULT_DEADLINES_S[k] for k in ("health", "health_generate", "liveness")}
