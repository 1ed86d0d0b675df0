"""``forensics validate --inventory FILE [--deploy] --cycles N``: the validation campaign (docs/validate.md)."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.cli.live_options import StormDisplay, json_option, positive_seconds, seconds_or_zero

AB_POOL_PAGES = 160  # the twins of --ab: 160 pages of 4 KiB in the decode's KV pool


@click.command(name="validate")
@click.option("--inventory", "inventory", type=click.Path(dir_okay=False), default=None,
              help="the deployment's inventory file (a twin's is printed by 'twin up'); A of --ab")
@click.option("--deploy", is_flag=True, help="deploy the patched engine first (patched_engine.deploy)")
@click.option("--restart-decodes/--no-restart-decodes", default=None,
              help="with --deploy: restart each decode whose release blocks on a restarted prefill (0.5.15); "
                   "by default only on a real-engine deployment of ours")
@click.option("--cycles", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--sessions", default=60, show_default=True, type=click.IntRange(min=1),
              help="concurrent sessions per cycle")
@click.option("--kill-after", default="0s", show_default=True, callback=seconds_or_zero,
              help="when the nemesis may strike, after each wave starts (phase kv: from then on, each session "
                   "the moment the decode is seen holding it with its KV pending)")
@click.option("--phase", type=click.Choice(["bootstrap", "kv", "stream", "any"]), default="kv", show_default=True)
@click.option("--prompt-tokens", default=3000, show_default=True, type=click.IntRange(min=1))
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--mode", type=click.Choice(["rst", "sigkill"]), default="rst", show_default=True)
@click.option("--sample", "sample_s", default="8s", show_default=True, callback=positive_seconds,
              help="how long each cycle's probes and metrics sample")
@click.option("--probe-deadline", "probe_deadline", default=None, callback=positive_seconds,
              help="the liveness probe's deadline after each cycle (default: the probes' own)")
@click.option("--liveness-deadline", default="180s", show_default=True, callback=positive_seconds,
              help="how long the deploy waits for liveness after the restart")
@click.option("--yes", is_flag=True, help="really deploy to / storm a deployment that is not a twin")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="save the campaign (campaign.json, frames/*.parquet, each cycle's evidence bundle)")
@click.option("--ab", is_flag=True, help="A/B: the same campaign against an unpatched and a patched deployment")
@click.option("--inventory-b", type=click.Path(dir_okay=False), default=None,
              help="with --ab: B, the deployment to patch (with --deploy) or already patched")
@click.option("--release", default="0.5.15", show_default=True,
              help="with --ab and no inventories: start an unpatched and a patched twin of this release")
@json_option
def command(inventory, deploy, restart_decodes, cycles, sessions, kill_after, phase, prompt_tokens, max_tokens, mode, sample_s,
            probe_deadline, liveness_deadline, yes, out, ab, inventory_b, release, as_json) -> None:
    """Deploy (optional), then storm N cycles and check each: PASS only when every check passed.

    After each cycle: liveness (a real one-token request), the logs since the cycle began
    (no thread death, no GUARD assertion, the storm's aborts), the bootstrap thread, and
    the decode's abort and failure counters. Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE (what was
    missing is said). Without a [twin] table the plan is shown and --yes is needed.
    """
    from forensics.storm import ConfirmationNeeded
    from forensics.validation import validate

    options = dict(cycles=cycles, sessions=sessions, kill_after=kill_after, phase=phase, prompt_tokens=prompt_tokens,
                   max_tokens=max_tokens, mode=mode, sample_s=sample_s, probe_deadline_s=probe_deadline, yes=yes)
    if ab:
        _ab(inventory, inventory_b, release, deploy, out, as_json, options)
    if inventory is None:
        raise click.UsageError("--inventory is required (or --ab to start two twins)")
    try:
        with StormDisplay(as_json) as display:
            campaign = validate(inventory, deploy=deploy, restart_decodes=restart_decodes,
                                liveness_deadline_s=liveness_deadline,
                                progress=display.update, **options)
    except ConfirmationNeeded as exc:
        refusal, plan = exc, exc.plan

        def show_plan() -> None:
            click.echo(str(plan))
            if deploy:
                click.echo("  first: deploy the patched engine (see 'forensics patch deploy' for its plan)")
            click.echo(f"forensics validate: {refusal}", err=True)

        conclude(as_json, 3, {"plan": plan.to_dict(), "plan_text": plan.lines(), "refused": str(refusal)},
                 show_plan, word="planned")
    saved = str(campaign.save(out)) if out else None

    def human() -> None:
        from forensics.cli.render import console

        console().print(campaign)
        if saved:
            click.echo(f"saved to {saved}")

    conclude(as_json, campaign.exit_status, dict(campaign.to_dict(), saved=saved), human,
             word=campaign.status.lower())


def _ab(inventory, inventory_b, release, deploy, out, as_json, options) -> None:
    """Run the A/B comparison and end the command (B's status is the answer)."""
    import contextlib
    import tempfile
    from pathlib import Path

    from forensics.validation import compare

    with contextlib.ExitStack() as stack:
        if inventory is None and inventory_b is None:
            import forensics.twin as twin_api

            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pdfx-ab-")))
            # A small decode KV pool, so killed sessions still wait in the decode's queues (and abort).
            a = twin_api.up(release, directory=base / "unpatched", pool_pages=AB_POOL_PAGES)
            stack.callback(a.down)
            b = twin_api.up(release, patched=True, directory=base / "patched", pool_pages=AB_POOL_PAGES)
            stack.callback(b.down)
            inventory, inventory_b = str(a.inventory_path), str(b.inventory_path)
        elif inventory is None or inventory_b is None:
            raise click.UsageError("--ab takes both --inventory (A) and --inventory-b (B), or neither (two twins)")
        comparison = compare(inventory, inventory_b, deploy_b=deploy, **options)
        saved = None
        if out:
            saved = {"a": str(comparison.a.save(Path(out) / "a")), "b": str(comparison.b.save(Path(out) / "b"))}

    def human() -> None:
        from forensics.cli.render import console

        console().print(comparison)

    conclude(as_json, comparison.exit_status, dict(comparison.to_dict(), saved=saved), human,
             word=comparison.status.lower())
