"""The ``forensics`` command: one group, sub-commands loaded only when invoked.

Each sub-command lives in its own module (``forensics/cli/<name>_cmd.py``) that
defines a click command or group called ``command``. Registering a new one is a
line in ``SUBCOMMANDS``; nothing heavy is imported to print ``--help``.
"""

from __future__ import annotations

import importlib

import click

from forensics import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "init": ("forensics.cli.init_cmd", "Write an inventory for your deployment and check it."),
    "logs": ("forensics.cli.logs_cmd", "Parse sglang PD logs into an incident timeline."),
    "demo": ("forensics.cli.demo_cmd", "Run the incident demo end to end."),
    "patch": ("forensics.cli.patch_cmd", "The NIXL bootstrap-loop fix: diff, apply, verify."),
    "handlers": ("forensics.cli.handlers_cmd", "Map and diff the bootstrap-loop message handlers."),
    "twin": ("forensics.cli.twin_cmd", "The local PD twin: up, status, restart, down."),
    "upgrade-order": ("forensics.cli.upgrade_cmd", "Rolling upgrade: prefills or decodes first?"),
    "collect": ("forensics.cli.collect_cmd", "Collect live evidence from a deployment into a bundle."),
    "diagnose": ("forensics.cli.diagnose_cmd", "HEALTHY, WEDGED, DEGRADED, DOWN or INCONCLUSIVE, with why."),
    "watch": ("forensics.cli.watch_cmd", "Probe continuously and print every verdict change."),
    "storm": ("forensics.cli.storm_cmd", "Abort storm: kill clients mid-request, diagnose each cycle."),
    "validate": ("forensics.cli.validate_cmd", "Validation campaign: storm cycles and checks, PASS or not."),
    "report": ("forensics.cli.report_cmd", "Write an investigation's postmortem: Markdown, HTML, PDF."),
    "engine": ("forensics.cli.engine_cmd", "The real engine's environment and models: prepare."),
    "threads": ("forensics.cli.threads_cmd", "Check py-spy and faulthandler dumps against a release."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in SUBCOMMANDS.items() if _module_exists(module))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module_name, _ = SUBCOMMANDS[name]
        if not _module_exists(module_name):
            return None
        return importlib.import_module(module_name).command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module_name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="forensics")
def cli() -> None:
    """PD Forensics: find, prove, fix and verify wedged sglang PD engines."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: every exit goes through the one exit contract (forensics.cli.contract)."""
    from forensics.cli import contract

    contract.run(cli, argv)
