"""``forensics watch --inventory FILE [--for 10m]``: print each verdict change as it happens."""

from __future__ import annotations

import sys

import click

from forensics.cli.contract import conclude_lines, emit_line
from forensics.cli.live_options import inventory_option, json_option, positive_seconds


@click.command(name="watch")
@inventory_option
@click.option("--for", "for_s", default=None, callback=positive_seconds,
              help="stop after this long (default: until Ctrl-C)")
@click.option("--interval", "interval_s", default="1s", show_default=True, callback=positive_seconds,
              help="how often probes, scrapes and thread dumps run")
@json_option
def command(inventory, for_s, interval_s, as_json) -> None:
    """Probe and sample continuously; print every verdict change (one JSON line each with --json).

    Exits with the last verdict's status (0 HEALTHY, 1 WEDGED/DEGRADED/DOWN, 3 INCONCLUSIVE).
    --json prints JSON Lines: one line per change, then a last line with "final": true whose
    status and exit are the command's own (an error or Ctrl-C included).
    """
    import threading

    from forensics.exitcodes import UsageProblem
    from forensics.watching import watch

    if inventory is None:
        raise UsageProblem("watch needs --inventory FILE (a twin's is printed by 'forensics twin up')")
    stop = threading.Event()
    changes = [0]
    live_display = None
    if sys.stdout.isatty() and not as_json:
        from rich.live import Live

        from forensics.cli.render import console

        live_display = Live(console=console(), refresh_per_second=4, transient=False)

    def change(verdict, previous) -> str:
        """``OLD -> NEW: first reason`` (``start`` for the first verdict)."""
        reason = verdict.reasons[0] if verdict.reasons else ""
        return f"{previous.verdict if previous else 'start'} -> {verdict.verdict}: {reason}"

    def change_line(verdict, previous) -> str:
        """One line for a log: the ISO time, then the change."""
        return f"{verdict.at} {change(verdict, previous)}"

    def change_lines(verdict, previous, width: int) -> str:
        """The same for a terminal: the clock only, wrapped between words with a hanging indent."""
        import textwrap

        clock = (verdict.at or "")[11:19] or "--:--:--"
        return "\n".join(textwrap.wrap(f"{clock} {change(verdict, previous)}", width=max(40, width),
                                        subsequent_indent=" " * 9, break_on_hyphens=False, break_long_words=True))

    def on_change(verdict, previous) -> None:
        changes[0] += 1
        if as_json:
            doc = {"status": verdict.status, "exit": int(verdict.exit_status), "change": True,
                   "previous": previous.verdict if previous else None, **verdict.to_dict()}
            emit_line(doc)
        elif live_display is not None:
            out = live_display.console
            out.print(change_lines(verdict, previous, out.width), markup=False, highlight=False, soft_wrap=True)
        else:
            print(change_line(verdict, previous), flush=True)

    def on_tick(verdict) -> None:
        live_display.update(verdict)  # the current verdict, redrawn in place under the change lines

    try:
        if live_display is not None:
            with live_display:
                last = watch(inventory, for_s=for_s, interval_s=interval_s, on_change=on_change, on_tick=on_tick,
                             stop=stop)
        else:
            last = watch(inventory, for_s=for_s, interval_s=interval_s, on_change=on_change, stop=stop)
    except KeyboardInterrupt:
        stop.set()
        raise
    # The per-change lines were the output; the exit status is the last verdict's, and so is the final line's.
    final = {"change": False, "changes": changes[0], **(last.to_dict() if last else {"verdict": None})}
    conclude_lines(as_json, last.exit_status if last else 3, final, word=last.status if last else None)
