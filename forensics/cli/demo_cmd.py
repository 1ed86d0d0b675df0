"""``forensics demo``: the whole incident story on the local twin (or real sglang), from the wedge to the postmortem."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.exitcodes import BAD, GOOD


@click.command()
@click.option("--sglang", "release", default="0.5.15", show_default=True, help="sglang release the deployment runs.")
@click.option("--engine", type=click.Choice(["twin", "sglang"]), default="twin", show_default=True,
              help="twin: this project's processes around sglang's bootstrap loop; sglang: real sglang "
                   "(its prefill, decode and mini LB on this machine, minutes)")
@click.option("--out", "out", type=click.Path(file_okay=False),
              help="Write the investigation, the report and demo.json here [default: ./forensics-demo-<UTC time>].")
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="Keep the deployment's own files (its logs) here [default: OUT/twin, OUT/engine].")
@click.option("--sessions", default=12, show_default=True, type=click.IntRange(1, 500),
              help="Storm sessions per validation cycle.")
@click.option("--cycles", default=1, show_default=True, type=click.IntRange(1, 20), help="Validation cycles.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def command(release, engine, out, directory, sessions, cycles, as_json):
    """Reproduce the wedge on a twin (or real sglang), diagnose it, diff the handlers, patch, validate, write the
    postmortem."""
    from forensics import demo

    options = {"out": out, "directory": directory, "sessions": sessions, "cycles": cycles, "engine": engine}
    if as_json:
        result = demo.run(release, **options)
        conclude(True, GOOD if result.ok else BAD, result.to_dict())
    from forensics.cli.render import console

    stream = console()
    with stream.status("starting", spinner="dots") as status:
        result = demo.run(release, progress=lambda message: status.update(message), **options)
    conclude(False, GOOD if result.ok else BAD, {}, lambda: stream.print(result))
