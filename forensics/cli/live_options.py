"""Options shared by ``collect``, ``diagnose`` and ``watch``: where the deployment is, how long to sample."""

from __future__ import annotations

import math
import sys

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
            seconds = parse_duration(value, max(param.opts, key=len)).total_seconds()
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


def seconds_or_zero(ctx, param, value):
    """Like :func:`positive_seconds`, but 0 (0s) is allowed."""
    if value is not None and str(value).strip() in ("0", "0s", "0.0"):
        return 0.0
    return positive_seconds(ctx, param, value)


class StormDisplay:
    """The storm's progress: a rich live line on stderr, in a terminal only (never under --json or in a pipe)."""

    def __init__(self, as_json: bool) -> None:
        self.live = None
        if as_json or not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.live import Live

        self.live = Live(console=Console(stderr=True), transient=True, refresh_per_second=8)

    def __enter__(self):
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, info: dict) -> None:
        if self.live is None:
            return
        from rich.text import Text

        parts = [f"cycle {info.get('cycle')}", str(info.get("stage", ""))]
        if "open" in info:
            parts.append(f"{info['sessions']} sessions: {info['open']} open ({info['waiting']} waiting, "
                         f"{info['streaming']} streaming), {info['killed']} killed, {info['ok']} ok, "
                         f"{info['fail']} failed")
        self.live.update(Text(" | ".join(parts)))
