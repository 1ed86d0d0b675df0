"""``forensics init``: write a starting inventory from what the on-call engineer knows, then check it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from forensics.cli.contract import conclude


@click.command()
@click.option("--out", "out_path", default="inventory.toml", show_default=True, type=click.Path(dir_okay=False),
              help="The inventory file to write (never overwritten without --force).")
@click.option("--name", default="pd", show_default=True, help="The deployment's name in reports and bundles.")
@click.option("--prefill", "prefills", multiple=True, metavar="[USER@]HOST[:PORT]",
              help="A prefill engine: where it runs and its HTTP port (or its URL); repeatable.")
@click.option("--decode", "decodes", multiple=True, metavar="[USER@]HOST[:PORT]", help="A decode engine; repeatable.")
@click.option("--router", metavar="URL|[USER@]HOST[:PORT]", help="The router (mini LB or gateway), if any.")
@click.option("--jump", metavar="[USER@]HOST[:PORT]", help="The bastion every engine host is reached through.")
@click.option("--unit", "units", multiple=True, metavar="ROLE=UNIT",
              help="The systemd unit of a role's engine, e.g. prefill=sglang-prefill.service; repeatable.")
@click.option("--key", help="SSH identity file for every host (default: the SSH config and ssh-agent).")
@click.option("--ssh-port", type=click.IntRange(1, 65535), default=None,
              help="SSH port of the engine hosts (default: the SSH config, else 22).")
@click.option("--known-hosts", help="known_hosts file to check the hosts' keys against (default ~/.ssh/known_hosts).")
@click.option("--sudo", is_flag=True, help="Read journals, /proc and py-spy through sudo -n on the engine hosts.")
@click.option("--py-spy", "py_spy", help="py-spy's path on the engine hosts (default: py-spy on PATH).")
@click.option("--sglang", "release", help="The sglang release the engines run (detected when left out).")
@click.option("--backend", type=click.Choice(["nixl", "mooncake", "mori", "ascend", "fake"]), default=None)
@click.option("--bootstrap-port", type=click.IntRange(1, 65535), default=8998, show_default=True,
              help="The prefill's --disaggregation-bootstrap-port.")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--no-check", is_flag=True, help="Write the file, skip the checks.")
@click.option("--timeout", type=click.FloatRange(0.5, 120), default=10.0, show_default=True,
              help="Seconds per check.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def command(out_path, name, prefills, decodes, router, jump, units, key, ssh_port, known_hosts, sudo, py_spy, release,
            backend, bootstrap_port, force, no_check, timeout, as_json):
    """Write an inventory for your deployment and check it: every host reached over SSH, every URL
    answering GET /health from here, every unit's journal readable, py-spy present.

    Asks for the prefill and decode when they are not given and a terminal is attached. Exit 0
    every check passed, 1 one failed (each listed with what to do), 2 a usage error.

        forensics init --prefill ops@10.0.3.17:30000 --decode ops@10.0.3.18:30000 \\
          --router http://10.0.3.18:8000 --jump ops@bastion --unit prefill=sglang-prefill.service
    """
    from forensics import readiness
    from forensics.exitcodes import UsageProblem
    from forensics.inventory.starter import EngineAnswer, starting_inventory

    out = Path(out_path)
    if out.exists() and not force:
        raise click.UsageError(f"{out} exists: choose another --out, or --force to overwrite it")
    interactive = not as_json and sys.stdin.isatty()
    if not prefills and interactive:
        prefills = (click.prompt("prefill engine ([user@]host:port or URL)"),)
    if not decodes and interactive:
        decodes = (click.prompt("decode engine ([user@]host:port or URL)"),)
    try:
        answers = ([EngineAnswer.parse("prefill", p) for p in prefills] + [EngineAnswer.parse("decode", d) for d in decodes]
                   + ([EngineAnswer.parse("router", router)] if router else []))
        table = {}
        for item in units:
            role, sep, unit = item.partition("=")
            if not sep or role not in ("prefill", "decode", "router") or not unit:
                raise UsageProblem(f"--unit {item!r}: expected ROLE=UNIT, e.g. prefill=sglang-prefill.service")
            table[role] = unit
        text = starting_inventory(name, answers, jump=jump, units=table, sglang=release, backend=backend, sudo=sudo,
                                  key=key, py_spy=py_spy, bootstrap_port=bootstrap_port, ssh_port=ssh_port,
                                  known_hosts=known_hosts)
    except UsageProblem as exc:
        raise click.UsageError(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    echo = (lambda line: click.echo(line, err=True)) if not as_json else None
    if echo:
        echo(f"wrote {out}")
    if no_check:
        conclude(as_json, 0, {"inventory": str(out), "checks": []}, lambda: None, word="written")
    result = readiness.check(out, timeout=timeout, progress=echo)

    def human() -> None:
        click.echo(result.text().splitlines()[0])
        if not result.failed:
            click.echo(f"next: forensics diagnose --inventory {out}")

    conclude(as_json, result.exit_status, result.to_dict(), human, word=result.word)
