"""``forensics upgrade-order``: which engines to move first in a rolling sglang upgrade."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude


@click.command(name="upgrade-order")
@click.option("--from", "current", required=True, help="the release the deployment runs now")
@click.option("--to", "target", required=True, help="the release it moves to")
@click.option("--find-via", is_flag=True,
              help="when no order works, look for a release in between that both hops can roll through "
                   "(up to six pair checks per candidate, newest first)")
@click.option("--via", "candidates", multiple=True, metavar="RELEASE",
              help="with --find-via: consider only these releases in between (repeatable; default: every "
                   "release on PyPI between the two)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
def command(current, target, find_via, candidates, as_json) -> None:
    """Check both orders of a rolling upgrade (prefills first, decodes first) with each release's own
    code in the engine sandbox, and say which to take. Exit 0: an order with a clean mixed window;
    1: every order stops (cannot serve, wedges) or costs something, or the target itself wedges."""
    from forensics.exitcodes import Undecided, UsageProblem
    from forensics.sandbox.errors import SandboxError
    from forensics.upgrade import find_via as search_via
    from forensics.upgrade import plan_upgrade

    if current == target:
        raise UsageProblem(f"--from and --to are both {current}: nothing to upgrade")
    if candidates and not find_via:
        raise UsageProblem("--via names candidates for --find-via; add --find-via")
    from forensics.cli.render import step_progress
    from forensics.upgrade import PAIR_CHECKS_PER_PLAN

    try:
        with step_progress(PAIR_CHECKS_PER_PLAN, "upgrade order") as step:
            plan = plan_upgrade(current, target, progress=step)
        via = None
        searched = find_via and plan.order == "neither"
        if searched:
            with step_progress(None, "upgrade route") as step:
                via = search_via(current, target, list(candidates) or None, progress=step)
    except SandboxError as exc:
        raise Undecided(f"sglang {current} -> {target}: the pair check could not run in the engine sandbox: "
                        f"{exc}") from None
    doc = plan.to_dict()
    if searched:
        doc["via"] = [hop.to_dict() for hop in via] if via else None

    def human() -> None:
        from forensics.cli.render import console as terminal

        console = terminal()
        console.print(plan)
        if not searched:
            return
        if via is None:
            console.print(f"No release between {current} and {target} lets both hops roll.")
            return
        console.print(f"Through {via[0].target}: {via[0].order}, then {via[1].order}.")
        console.print(via[0])
        console.print(via[1])

    conclude(as_json, plan.exit_status, doc, human, word=plan.order)
