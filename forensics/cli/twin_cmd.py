"""``forensics twin up|status|restart|down``: the local PD twin from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from forensics.exitcodes import BAD, GOOD

INVENTORY_HELP = "the twin's inventory file (printed by 'twin up')"


def _emit(as_json: bool, data: dict, human) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        from rich.console import Console

        Console().print(human)


@click.group(name="twin")
def command() -> None:
    """The local PD twin: prefill (sglang's real bootstrap loop), decode, router on 127.0.0.1."""


@command.command()
@click.option("--sglang", "version", default="0.5.15", show_default=True, help="sglang release to run")
@click.option("--patched", is_flag=True, help="patch the twin's copy of nixl/conn.py with the codemod")
@click.option("--backend", type=click.Choice(["nixl", "mooncake"]), default="nixl", show_default=True)
@click.option("--base-port", type=int, default=None, help="router N, prefill N+1, bootstrap N+2, decode N+3")
@click.option("--waiting-timeout", type=float, default=None, help="decode waiting timeout, s (sglang: 300)")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, help="twin directory")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def up(version, patched, backend, base_port, waiting_timeout, directory, as_json) -> None:
    """Start a twin and print its URLs and inventory."""
    from forensics.twin import api
    from forensics.twin.settings import DEFAULT_WAITING_TIMEOUT_S

    deployment = api.up(version, patched=patched, backend=backend, base_port=base_port,
                        waiting_timeout=waiting_timeout or DEFAULT_WAITING_TIMEOUT_S, directory=directory)
    data = dict(deployment.urls(), sglang=version, patched=patched, backend=backend,
                directory=str(deployment.directory), timings_s=deployment.timings,
                pids={role: deployment.pid(role) for role in ("prefill", "decode", "router")})
    _emit(as_json, data, deployment)
    if not as_json:
        click.echo(f"inventory: {deployment.inventory_path}")


@command.command()
@click.option("--inventory", required=True, type=click.Path(dir_okay=False), help=INVENTORY_HELP)
@click.option("--json", "as_json", is_flag=True)
def status(inventory, as_json) -> None:
    """Is each process alive and answering; is the prefill's bootstrap thread alive? (exit 1 if not)"""
    from forensics.twin import api

    report = api.attach(inventory).status()
    roles = report["roles"]
    healthy = all(r["alive"] and r["answering"] for r in roles.values()) and roles["prefill"].get(
        "bootstrap_thread_alive") is True
    report["healthy"] = healthy
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"twin {report['sglang']}{' (patched)' if report['patched'] else ''}")
        for column in ("role", "pid", "alive", "answering", "bootstrap thread"):
            table.add_column(column)
        for role, entry in roles.items():
            table.add_row(role, str(entry["pid"]), str(entry["alive"]), str(entry["answering"]),
                          str(entry.get("bootstrap_thread_alive", "")))
        _emit(False, report, table)
    sys.exit(GOOD if healthy else BAD)


@command.command()
@click.argument("role", type=click.Choice(["prefill", "decode", "router", "all"]), default="all")
@click.option("--inventory", required=True, type=click.Path(dir_okay=False), help=INVENTORY_HELP)
@click.option("--json", "as_json", is_flag=True)
def restart(role, inventory, as_json) -> None:
    """Restart one role (what 'systemctl restart' is for a live host)."""
    from forensics.twin import api

    deployment = api.attach(inventory)
    seconds = deployment.restart(role)
    data = {"restarted": role, "seconds": round(seconds, 3), "inventory": str(Path(inventory))}
    _emit(as_json, data, f"restarted {role} in {seconds:.2f}s")


@command.command()
@click.option("--inventory", required=True, type=click.Path(dir_okay=False), help=INVENTORY_HELP)
@click.option("--json", "as_json", is_flag=True)
def down(inventory, as_json) -> None:
    """Stop every process of the twin."""
    from forensics.twin import api

    stopped = api.attach(inventory).down()
    _emit(as_json, {"stopped": stopped, "inventory": str(Path(inventory))}, f"stopped: {', '.join(stopped) or 'nothing'}")
