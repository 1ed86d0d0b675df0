"""Options shared by ``collect``, ``diagnose`` and ``watch``: where the deployment is, how long to sample."""

from __future__ import annotations

import math

import click


def positive_seconds(ctx, param, value):
    """A positive, finite number of seconds (a duration like 30s, 2m, 1h also reads)."""
    if value is None:
        return None
    from forensics.exitcodes import UsageProblem
    from forensics.logs.timewindow import parse_duration

    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parse_duration(value, f"--{param.name.replace('_', '-')}").total_seconds()
        except UsageProblem as exc:
            raise click.BadParameter(str(exc)) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise click.BadParameter(f"expected a positive duration, got {value!r}")
    return seconds


inventory_option = click.option(
    "--inventory", "inventory", type=click.Path(dir_okay=False), default=None,
    help="the deployment's inventory file (a twin's: printed by 'twin up')")
sample_option = click.option(
    "--sample", "sample_s", default="8s", show_default=True, callback=positive_seconds,
    help="how long probes and metrics sample (a wedge shows over time, not in one look)")
since_option = click.option("--since", default="30m", show_default=True,
                            help="start of the log window: a time, @epoch, or a duration before now")
json_option = click.option("--json", "as_json", is_flag=True, help="print one JSON object")
