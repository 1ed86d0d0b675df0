"""``forensics diagnose (--inventory FILE | --bundle DIR)``: HEALTHY, WEDGED, DEGRADED, DOWN or INCONCLUSIVE."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.cli.live_options import inventory_option, json_option, sample_option, since_option


@click.command(name="diagnose")
@inventory_option
@click.option("--bundle", "bundle", type=click.Path(file_okay=False), default=None,
              help="a bundle folder written by 'forensics collect'")
@since_option
@sample_option
@json_option
@click.option("--verbose", "-v", is_flag=True, help="every reason, signal and gap in full (default: at most 24 lines)")
def command(inventory, bundle, since, sample_s, as_json, verbose) -> None:
    """Diagnose a deployment, live (--inventory) or from a collected bundle (--bundle).

    Exit 0 HEALTHY, 1 WEDGED, DEGRADED or DOWN, 3 INCONCLUSIVE. WEDGED rests on at least
    two independent signals, never on a timeout alone.
    """
    from forensics.diagnosing import diagnose
    from forensics.exitcodes import UsageProblem

    if (inventory is None) == (bundle is None):
        raise UsageProblem("diagnose needs exactly one of --inventory FILE or --bundle DIR")
    if bundle is not None:
        verdict = diagnose(bundle=bundle)
    else:
        from forensics.cli.render import collection_progress

        bar, update = collection_progress(as_json)
        if bar is not None:
            bar.start()
        try:
            verdict = diagnose(inventory=inventory, since=since, sample_s=sample_s, progress=update)
        finally:
            if bar is not None:
                bar.stop()

    def human() -> None:
        from forensics.cli.render import console

        out = console()
        out.print(verdict if verbose else verdict.terse(out.width))

    conclude(as_json, verdict.exit_status, verdict.to_dict(), human, word=verdict.status)
