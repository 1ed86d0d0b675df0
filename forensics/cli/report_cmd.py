"""``forensics report --investigation DIR --out DIR [--format md,html,pdf]``: the postmortem (docs/report.md)."""

from __future__ import annotations

import click

from forensics.cli.contract import conclude
from forensics.cli.live_options import json_option


@click.command(name="report")
@click.option("--investigation", "investigation", required=True, type=click.Path(file_okay=False),
              help="the investigation folder (investigation.toml and its parts)")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="where the report files go")
@click.option("--format", "formats", default="md,html,pdf", show_default=True,
              help="comma-separated: md, html, pdf")
@json_option
def command(investigation, out, formats, as_json) -> None:
    """Write the postmortem (Google SRE template) of an investigation as Markdown, HTML and PDF.

    Exit 0 written, 3 an input is missing (named), 4 the output cannot be written (or
    weasyprint cannot run for the PDF).
    """
    from forensics.report import parse_formats, write_report

    written = write_report(investigation, out, parse_formats(formats))
    paths = {fmt: str(path) for fmt, path in written.items()}

    def human() -> None:
        for fmt, path in paths.items():
            click.echo(f"{fmt}: {path}")

    conclude(as_json, 0, {"investigation": str(investigation), "written": paths}, human, word="written")
