"""Which engines to upgrade first, when a PD deployment moves from one sglang release to another.

A rolling upgrade runs a mixed pair for a while: either the prefills are on the new release
behind old decodes, or the decodes are upgraded first behind old prefills. The two orders are
not alike. 0.5.15 → 0.5.16 with the decodes first puts a 0.5.15 prefill behind a decode that
sends ABORT: it wedges on the first abort; with the prefills first, it survives. 0.5.22 → 0.5.23
with the decodes first cannot serve at all (the 0.5.23 decode completes only on a ``KV_STATUS``
the 0.5.22 prefill never sends).

:func:`plan_upgrade` runs the twin's pair check (:func:`forensics.twin.pair.check_pair`: each
release's own code, replayed in the engine sandbox, in both directions) for both orders, sorts
each order's findings into what stops it (cannot serve, wedges) and what it costs (aborted pages
held for a timeout, failures learned only at the waiting timeout), and says which order to take.
NIXL pairs, as the pair check.

Example: ``fx.upgrade.plan_upgrade("0.5.15", "0.5.16").order`` -> ``"prefills first"``
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from forensics.exitcodes import BAD, GOOD, ExitStatus
from forensics.twin.pair import ACK_DOES_NOT_COUNT

PREFILLS_FIRST, DECODES_FIRST = "prefills first", "decodes first"
PAIR_CHECKS_PER_PLAN = 3  # prefills first, decodes first, and the target alone


@dataclass
class OrderFindings:
    """One order's mixed window: the pair that runs during it and what that pair does."""

    order: str  # PREFILLS_FIRST or DECODES_FIRST
    prefill: str
    decode: str
    stops: list[str] = field(default_factory=list)  # the pair cannot serve, or wedges
    costs: list[str] = field(default_factory=list)  # it serves, at a price
    summary: str = ""  # the pair check's own sentence

    @property
    def state(self) -> str:
        """``stops``, ``costs`` or ``clean``: the window in one word."""
        return "stops" if self.stops else "costs" if self.costs else "clean"

    @property
    def rank(self) -> int:
        """0 clean, 1 serves at a cost, 2 stopped."""
        return 2 if self.stops else 1 if self.costs else 0

    def to_dict(self) -> dict:
        return {"order": self.order, "prefill": self.prefill, "decode": self.decode, "state": self.state,
                "stops": list(self.stops),
                "costs": list(self.costs), "summary": self.summary}


def findings_of(order: str, check, *, failures_read_today: bool) -> OrderFindings:
    """Sort a :class:`~forensics.twin.pair.PairCheck` into what stops the order and what it costs.

    A cost is what the mixed window does worse than the deployment does today: an ``ABORT_ACK``
    that does not count (every same-release pair that holds pages counts its own), and a failed
    transfer the decode learns of only at its waiting timeout where the current release's decode
    reads the prefill's failure status (``failures_read_today``)."""
    found = OrderFindings(order=order, prefill=check.prefill, decode=check.decode, summary=check.summary())
    if check.refused:
        found.stops.append(f"cannot serve: {check.refused}")
        return found
    if check.wedges:
        found.stops.append(f"wedges: {check.abort_fate}")
    ack = check.prefill_to_decode.get("abort ack", "")
    if ack.startswith(ACK_DOES_NOT_COUNT):
        found.costs.append(f"aborted requests' KV pages held: {ack}")
    failure = check.prefill_to_decode.get("transfer failure", "")
    if failures_read_today and failure and "is taken by" not in failure:
        found.costs.append(f"failed transfers noticed late: {failure}")
    return found


@dataclass
class UpgradePlan:
    """Both orders of a rolling upgrade from ``current`` to ``target``, and which to take."""

    current: str
    target: str
    orders: list[OrderFindings]
    warnings: list[str] = field(default_factory=list)  # about the target itself, whatever the order

    @property
    def best(self) -> list[OrderFindings]:
        """The orders with the fewest problems (both, when they tie)."""
        lowest = min(o.rank for o in self.orders)
        return [o for o in self.orders if o.rank == lowest]

    @property
    def order(self) -> str:
        """``prefills first``, ``decodes first``, ``either order``, or ``neither`` (no mixed pair can
        serve without wedging: every engine must change release at once)."""
        best = self.best
        if best[0].rank == 2:
            return "neither"
        return best[0].order if len(best) == 1 else "either order"

    @property
    def exit_status(self) -> ExitStatus:
        """GOOD when an order has a clean mixed window and the target survives its own decode's
        ABORT; BAD otherwise."""
        return GOOD if self.best[0].rank == 0 and not self.warnings else BAD

    def advice(self) -> str:
        """One sentence a person can act on."""
        if self.order == "neither":
            return (f"No rolling order works from {self.current} to {self.target}: each mixed pair cannot serve or "
                    "wedges. Upgrade every engine at once (a short outage), or go through a release that pairs with "
                    "both.")
        best = self.best[0]
        how = "Upgrade the prefills first." if self.order == PREFILLS_FIRST else (
            "Upgrade the decodes first." if self.order == DECODES_FIRST else "Either order works.")
        if best.costs:
            how += " While the pair is mixed: " + "; ".join(c.split(":", 1)[0] for c in best.costs) + "."
        return how

    def to_dict(self) -> dict:
        return {"current": self.current, "target": self.target, "order": self.order, "advice": self.advice(),
                "warnings": list(self.warnings), "orders": [o.to_dict() for o in self.orders]}

    def __str__(self) -> str:
        lines = [f"sglang {self.current} -> {self.target}: {self.order}", f"  {self.advice()}"]
        lines += [f"  warning: {w}" for w in self.warnings]
        for o in self.orders:
            lines.append(f"  {o.order} (prefill {o.prefill} / decode {o.decode}): {o.state}")
            lines += [f"    - {line}" for line in o.stops + o.costs]
        return "\n".join(lines)

    def __rich__(self):
        from rich.markup import escape
        from rich.table import Table

        caption = " ".join([self.advice(), *(f"Warning: {w}" for w in self.warnings)])
        table = Table(title=f"sglang {self.current} → {self.target}: {self.order}", caption=escape(caption),
                      show_lines=True, expand=False)
        table.add_column("order", no_wrap=True)
        table.add_column("mixed pair", no_wrap=True)
        table.add_column("window")
        table.add_column("why", overflow="fold")
        for o in self.orders:
            colour = {"stops": "red", "costs": "yellow", "clean": "green"}[o.state]
            state = f"[{colour}]{o.state}[/{colour}]"
            why = "\n".join(o.stops + o.costs) or "every frame and signal taken; survives the decode's ABORT"
            table.add_row(o.order, f"prefill {o.prefill}\ndecode {o.decode}", state, escape(why))
        return table

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(o.order)}</td><td>prefill {html.escape(o.prefill)} / decode "
            f"{html.escape(o.decode)}</td><td>{o.state}</td>"
            f"<td style='text-align:left'>{'<br>'.join(html.escape(x) for x in o.stops + o.costs) or 'clean'}</td></tr>"
            for o in self.orders)
        return (f"<div><b>sglang {html.escape(self.current)} → {html.escape(self.target)}: "
                f"{html.escape(self.order)}</b><p>{html.escape(self.advice())}</p>"
                + "".join(f"<p><b>warning</b>: {html.escape(w)}</p>" for w in self.warnings)
                + "<table><tr><th>order</th>"
                f"<th>mixed pair</th><th>window</th><th>why</th></tr>{rows}</table></div>")


def find_via(current, target, releases=None, *, progress=None) -> tuple[UpgradePlan, UpgradePlan] | None:
    """Where no rolling order works: a release between the two that both hops can roll through
    (each hop has an order that neither refuses nor wedges), newest first, as the two plans; None
    when none does. ``releases``: the candidates (default: every release on PyPI strictly between
    ``current`` and ``target``). Each candidate costs up to six pair checks. ``progress``: as
    :func:`plan_upgrade`'s, one step per pair check.

    Example: ``fx.upgrade.find_via("0.5.15", "0.5.23", ["0.5.22"])``
    """
    from packaging.version import Version

    from forensics.progress import step_reporter
    from forensics.sglang_source import available_releases

    low, high = str(getattr(current, "version", current)), str(getattr(target, "version", target))
    if releases is None:
        releases = [r for r in available_releases(low, high) if Version(low) < Version(r) < Version(high)]
    checks: dict = {}  # each pair checked once: every second hop ends at the same target
    with step_reporter(progress, PAIR_CHECKS_PER_PLAN * 2 * len(releases), "upgrade route", unit="pair check") as step:
        for candidate in sorted(releases, key=Version, reverse=True):
            first = plan_upgrade(current, candidate, progress=step or False, checks=checks)
            if first.order == "neither":
                continue
            second = plan_upgrade(candidate, target, progress=step or False, checks=checks)
            if second.order != "neither":
                return first, second
    return None


def plan_upgrade(current, target, *, progress=None, checks: dict | None = None) -> UpgradePlan:
    """Check both orders of a rolling upgrade from ``current`` to ``target`` (release numbers or
    :class:`~forensics.sglang_source.SglangSource`), each release's own code in the engine sandbox:
    three pair checks of about 3 s each (the two mixed pairs and the target's own). ``progress``:
    see :mod:`forensics.progress` (a bar in a notebook; a callable gets each finished pair).
    ``checks``: pair checks already made, by (prefill, decode) release; filled with this plan's.

    Raises :class:`~forensics.sandbox.errors.SandboxError` when a release cannot run here, and
    :class:`~forensics.sglang_source.SourceError` when it cannot be fetched: never a guess.

    Example: ``fx.upgrade.plan_upgrade("0.5.15", "0.5.16").advice()``
    """
    from forensics.progress import step_reporter
    from forensics.sglang_source import fetch
    from forensics.twin.completion_signals import failure_report
    from forensics.twin.pair import check_pair
    from patched_engine.decode_hazard import release_blocks

    old = current if hasattr(current, "root") else fetch(str(current))
    new = target if hasattr(target, "root") else fetch(str(target))
    with step_reporter(progress, PAIR_CHECKS_PER_PLAN, "upgrade order", unit="pair check") as step:
        known = {} if checks is None else checks

        def pair(prefill, decode):
            key = (str(prefill.root), str(decode.root))
            if key not in known:
                known[key] = check_pair(prefill, decode)
            check = known[key]
            if step:
                step(f"prefill {prefill.version} / decode {decode.version}")
            return check

        today = failure_report(old, old)[1]
        prefills_first = findings_of(PREFILLS_FIRST, pair(new, old), failures_read_today=today)
        decodes_first = findings_of(DECODES_FIRST, pair(old, new), failures_read_today=today)
        # Where the upgrade ends: the target's own pair, its own decode's ABORT into its own loop.
        alone = pair(new, new)
    # The prefills restart behind decodes that stay up: the old ones (prefills first) or the new
    # ones (decodes first). A decode release that never reconnects to a restarted prefill blocks.
    for found, decodes in ((prefills_first, old), (decodes_first, new)):
        if not found.stops and (where := release_blocks(decodes.version)):
            found.costs.append(
                f"decodes blocked by the prefill restart: the {decodes.version} decodes keep a socket to each "
                f"prefill that never reconnects and has no send timeout ({where}); a send to a restarted "
                "prefill waits forever, so restart those decodes right after the prefills")
    plan = UpgradePlan(current=old.version, target=new.version, orders=[prefills_first, decodes_first])
    if alone.wedges:
        plan.warnings.append(f"sglang {new.version} itself wedges on the first abort ({alone.abort_fate}): "
                             "patch it (forensics patch) or choose a release that survives its decode's ABORT")
    return plan
