"""``forensics threads check``: thread dumps from files and logs against a release's threads."""

from __future__ import annotations

import textwrap

import click

from forensics.cli.contract import conclude


@click.group()
def command() -> None:
    """Thread dumps of sglang's processes: check them against what a release runs."""


@command.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--sglang", "release", required=True, help="The release the engine runs (0.5.15), or a source directory.")
@click.option("--backend", default="nixl", show_default=True, help="The KV transfer backend (nixl, mooncake).")
@click.option("--role", type=click.Choice(["prefill", "decode"]), required=True,
              help="The role of the engine the dumps were taken of.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def check_command(files, release, backend, role, as_json):
    """Check the scheduler's threads in py-spy dumps (text, --native, --json), faulthandler dumps
    or logs holding them (sglang's own "Pyspy dump for PID N" blocks) against those RELEASE's
    KV manager starts for ROLE.

    Exit 0 every expected thread is in every scheduler dump of the role, 1 one is missing (or
    runs in another number), 3 undecidable: no scheduler dump of the role among the files, a
    dump cut short or damaged where the thread should be, a file that cannot be read.
    """
    from forensics.threads.expected import NoKVManager
    from forensics.threads.filecheck import check_dump_files

    try:
        result = check_dump_files(files, sglang=release, role=role, backend=backend)
    except NoKVManager as exc:
        raise click.BadParameter(str(exc), param_hint="--backend") from None

    def human() -> None:
        from forensics.cli.render import console

        out = console()
        style = {"clean": "bold green", "findings": "bold red"}.get(result.status, "bold yellow")
        lines = result.text().splitlines()
        out.print(lines[0], style=style, markup=False, highlight=False)
        for line in lines[1:]:
            # wrapped under its own indent, so a reason that runs on stays readable at 80 columns
            indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
            out.print(textwrap.fill(line, width=max(out.width, 40), subsequent_indent=indent,
                                    break_on_hyphens=False, break_long_words=False),
                      markup=False, highlight=False, soft_wrap=True)

    conclude(as_json, result.exit_status, result.to_dict(), human, word=result.status)
