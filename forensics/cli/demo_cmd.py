"""``forensics demo``: the incident on the local twin, vulnerable then patched, in under a minute."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.exitcodes import BAD, GOOD


@click.command()
@click.option("--sglang", "release", default="0.5.15", show_default=True, help="sglang release the twin runs.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="Keep the twins' files here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def command(release, directory, as_json):
    """Wedge a vulnerable twin with one killed client, then show the patched twin surviving it."""
    from forensics import demo

    if as_json:
        result = demo.run(release, directory=directory)
        conclude(True, GOOD if result.ok else BAD, result.to_dict())
    from forensics.cli.render import console

    out = console()
    with out.status("starting", spinner="dots") as status:
        result = demo.run(release, directory=directory, progress=lambda message: status.update(message))
    conclude(False, GOOD if result.ok else BAD, {}, lambda: out.print(result))
