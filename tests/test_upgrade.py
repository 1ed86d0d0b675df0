"""Rolling-upgrade order: each release's own code decides which engines may move first.

Every verdict below comes from the pair check (the engine sandbox running both releases'
code) and the decode hazard (the decode release's own ``_connect``), never from a version list.
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import invoke

from forensics.exitcodes import BAD, GOOD, USAGE
from forensics.upgrade import DECODES_FIRST, PREFILLS_FIRST, find_via, plan_upgrade

pytestmark = pytest.mark.server  # every plan runs pair checks in sandbox engines


def _order(plan, name: str):
    return next(o for o in plan.orders if o.order == name)


@pytest.mark.timeout(240)
def test_0_5_15_to_0_5_16_moves_the_prefills_first_and_restarts_the_old_decodes():
    plan = plan_upgrade("0.5.15", "0.5.16")
    assert plan.order == PREFILLS_FIRST and plan.exit_status == BAD and not plan.warnings
    decodes_first = _order(plan, DECODES_FIRST)
    assert (decodes_first.prefill, decodes_first.decode) == ("0.5.15", "0.5.16")
    [stop] = decodes_first.stops  # the old loop has no ABORT case; the new decode sends ABORT
    assert stop.startswith("wedges: its bootstrap_thread dies on the decode's ABORT") and "Foreign traffic?" in stop
    prefills_first = _order(plan, PREFILLS_FIRST)
    assert not prefills_first.stops
    # The old decodes stay up while the prefills restart: 0.5.15's never reconnect (its own source line).
    [cost] = prefills_first.costs
    assert cost.startswith("decodes blocked by the prefill restart: the 0.5.15 decodes")
    assert "common/conn.py:1101 CommonKVReceiver._connect" in cost
    assert plan.advice().startswith("Upgrade the prefills first. While the pair is mixed: decodes blocked")
    page = plan._repr_html_()  # a notebook shows the same, escaped
    assert "prefills first" in page and "b&#x27;NixlMsgGuard&#x27;" in page and "b'NixlMsgGuard'" not in page
    doc = plan.to_dict()
    assert doc["order"] == PREFILLS_FIRST and [o["order"] for o in doc["orders"]] == [PREFILLS_FIRST, DECODES_FIRST]


@pytest.mark.timeout(240)
def test_0_5_22_to_0_5_23_cannot_move_the_decodes_first_and_0_5_21_to_0_5_22_holds_aborted_pages():
    plan = plan_upgrade("0.5.22", "0.5.23")
    assert (plan.order, plan.exit_status) == (PREFILLS_FIRST, GOOD)
    assert _order(plan, PREFILLS_FIRST).rank == 0
    [stop] = _order(plan, DECODES_FIRST).stops
    assert stop.startswith("cannot serve: the 0.5.23 decode completes a transfer only on the prefill's KV_STATUS")

    held = plan_upgrade("0.5.21", "0.5.22")
    assert (held.order, held.exit_status) == ("either order", BAD)
    for order in held.orders:
        assert not order.stops
        [cost] = order.costs
        assert cost.startswith("aborted requests' KV pages held: none that counts")
        assert "DEFERRED_DECODE_KV_RELEASE_TIMEOUT, 30 s" in cost
    assert held.advice() == "Either order works. While the pair is mixed: aborted requests' KV pages held."


@pytest.mark.timeout(240)
def test_a_vulnerable_target_is_named_whatever_the_order():
    plan = plan_upgrade("0.5.14", "0.5.15")
    assert plan.order == "neither" and plan.exit_status == BAD
    [warning] = plan.warnings
    assert warning.startswith("sglang 0.5.15 itself wedges on the first abort") and "forensics patch" in warning
    assert "warning: sglang 0.5.15 itself wedges" in str(plan)


@pytest.mark.timeout(300)
def test_no_rolling_order_from_0_5_15_to_0_5_23_but_one_through_0_5_22(tmp_path):
    status, out, err = invoke("upgrade-order", "--from", "0.5.15", "--to", "0.5.23", "--find-via",
                              "--via", "0.5.22", "--via", "0.5.16", "--json")
    assert status == BAD, err
    doc = json.loads(out)
    assert (doc["status"], doc["order"]) == ("neither", "neither")
    assert all(o["state"] == "stops" and o["stops"][0].startswith("cannot serve") for o in doc["orders"])
    first, second = doc["via"]  # the newest candidate that works is tried first
    assert (first["current"], first["target"], first["order"]) == ("0.5.15", "0.5.22", PREFILLS_FIRST)
    assert (second["current"], second["target"], second["order"]) == ("0.5.22", "0.5.23", PREFILLS_FIRST)
    # Progress went to stderr, one line per pair check (not a terminal here), never to the JSON.
    assert "upgrade order: prefill 0.5.23 / decode 0.5.15 (1/3)" in err
    assert "upgrade route: prefill 0.5.22 / decode 0.5.15 (1)" in err
    # The library gives the same route; a candidate that cannot pair with both is no route.
    assert find_via("0.5.15", "0.5.23", ["0.5.16"]) is None


@pytest.mark.timeout(240)
def test_the_terminal_table_fits_80_columns_and_bad_input_is_a_usage_error():
    status, out, _ = invoke("upgrade-order", "--from", "0.5.16", "--to", "0.5.17", columns=80)
    assert status == GOOD
    assert "0.5.16 → 0.5.17: either order" in out and "Either order works." in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert invoke("upgrade-order", "--from", "0.5.16", "--to", "0.5.16")[0] == USAGE
    status, _, err = invoke("upgrade-order", "--from", "0.5.16", "--to", "0.5.17", "--via", "0.5.16")
    assert status == USAGE and "--find-via" in err
