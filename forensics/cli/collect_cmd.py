"""``forensics collect --inventory FILE --out DIR``: every piece of live evidence into a bundle."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.cli.live_options import inventory_option, json_option, sample_option, since_option
from forensics.cli.render import collection_progress


@click.command(name="collect")
@inventory_option
@click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="the bundle folder to write")
@since_option
@click.option("--until", default=None, help="end of the log window (default: now)")
@sample_option
@json_option
def command(inventory, out, since, until, sample_s, as_json) -> None:
    """Collect probes, metrics, processes, settings, thread dumps and logs into a bundle folder.

    Exit 0 when every piece was collected, 3 when some piece is missing (named), 4 when
    nothing could be.
    """
    from forensics.bundle import check_out, write_bundle
    from forensics.collection import collect, collection_status
    from forensics.exitcodes import UsageProblem

    if inventory is None:
        raise UsageProblem("collect needs --inventory FILE (a twin's is printed by 'forensics twin up')")
    check_out(out)  # before any probe: a bundle that cannot be written must not cost the deployment a probe
    bar, update = collection_progress(as_json)
    if bar is not None:
        bar.start()
    try:
        evidence = collect(inventory, since=since, until=until, sample_s=sample_s, progress=update)
    finally:
        if bar is not None:
            bar.stop()
    word, status = collection_status(evidence)
    folder = write_bundle(evidence, out, status=word, exit_code=int(status))
    pieces = {name: len(frame) for name, frame in evidence.frames.items()}
    doc = {"bundle": str(folder), "pieces": pieces, "gaps": [g.to_dict() for g in evidence.gaps],
           "commands": len(evidence.commands)}

    def human() -> None:
        from forensics.cli.render import console

        out_ = console()
        out_.print(f"[bold]{word}[/]: bundle written to {folder}")
        for name, rows in pieces.items():
            out_.print(f"  {name:<17} {rows:>8} rows")
        for gap in evidence.gaps:
            out_.print(f"  [yellow]missing[/] {gap}", soft_wrap=False)

    conclude(as_json, status, doc, human, word=word)
