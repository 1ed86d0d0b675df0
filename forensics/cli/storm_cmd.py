"""``forensics storm --inventory FILE``: the abort storm, then the live diagnosis after each cycle."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.cli.live_options import StormDisplay, json_option, positive_seconds, seconds_or_zero


@click.command(name="storm")
@click.option("--inventory", "inventory", type=click.Path(dir_okay=False), required=True,
              help="the deployment's inventory file (a twin's is printed by 'twin up')")
@click.option("--sessions", default=60, show_default=True, type=click.IntRange(min=1), help="concurrent sessions per cycle")
@click.option("--kill-after", default="0s", show_default=True, callback=seconds_or_zero,
              help="when the nemesis may strike, after each wave starts (phase kv: from then on, each session "
                   "the moment the decode is seen holding it with its KV pending)")
@click.option("--cycles", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--phase", type=click.Choice(["bootstrap", "kv", "stream", "any"]), default="kv", show_default=True,
              help="which sessions the nemesis kills: still waiting (bootstrap, kv), streaming, or any open one")
@click.option("--waves", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--wave-interval", default="1s", show_default=True, callback=seconds_or_zero)
@click.option("--prompt-tokens", default=3000, show_default=True, type=click.IntRange(min=1))
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--mode", type=click.Choice(["rst", "sigkill"]), default="rst", show_default=True,
              help="reset the sockets in-process (RST), or SIGKILL separate client processes")
@click.option("--session-timeout", default=None, callback=positive_seconds,
              help="a stream not ended by then is 'info' (default: kill-after + 30s)")
@click.option("--settle", default="3s", show_default=True, callback=seconds_or_zero,
              help="wait after the strike before checking (sglang aborts a stream ~2 s after the close)")
@click.option("--sample", "sample_s", default="8s", show_default=True, callback=positive_seconds,
              help="how long the check's probes and metrics sample")
@click.option("--yes", is_flag=True, help="really storm a deployment that is not a twin (else: show the plan)")
@json_option
def command(inventory, sessions, kill_after, cycles, phase, waves, wave_interval, prompt_tokens, max_tokens, mode,
            session_timeout, settle, sample_s, yes, as_json) -> None:
    """Storm a deployment with clients killed mid-request, then diagnose it after each cycle.

    Exit 0 when the target stayed HEALTHY through storms that produced aborts, 1 when it
    did not stay HEALTHY (WEDGED, DEGRADED, DOWN), 3 when the storm produced no abort (or
    a verdict was INCONCLUSIVE). An inventory without a [twin] table is a live deployment:
    without --yes only the plan is shown (exit 3, nothing sent).
    """
    from forensics.exitcodes import ExitStatus
    from forensics.storm import ConfirmationNeeded, run_storm
    from forensics.storm.runner import make_plan

    options = dict(sessions=sessions, kill_after=kill_after, cycles=cycles, phase=phase, waves=waves,
                   wave_interval=wave_interval, prompt_tokens=prompt_tokens, max_tokens=max_tokens, mode=mode,
                   session_timeout=session_timeout, settle=settle, sample_s=sample_s)
    plan = make_plan(inventory, **options)
    if not plan.twin and not yes:
        refusal = ConfirmationNeeded(plan)

        def show_plan() -> None:
            click.echo(str(plan))
            click.echo(f"forensics storm: {refusal}", err=True)

        conclude(as_json, ExitStatus.INCONCLUSIVE, {"plan": plan.to_dict(), "plan_text": plan.lines(),
                                                    "refused": str(refusal)}, show_plan, word="planned")
    with StormDisplay(as_json) as display:
        result = run_storm(inventory, yes=yes, progress=display.update, **options)

    def human() -> None:
        from forensics.cli.render import console

        console().print(result)

    doc = dict(result.to_dict(), history=result.history)
    conclude(as_json, result.exit_status, doc, human, word=result.status)
