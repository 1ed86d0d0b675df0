"""``forensics twin up|status|restart|down``: the local PD twin from the command line."""

from __future__ import annotations

from pathlib import Path

import click

from forensics.cli.contract import conclude
from forensics.exitcodes import BAD, GOOD

INVENTORY_HELP = "the twin's inventory file (printed by 'twin up')"


def _waiting_timeout(ctx, param, value):
    """Positive and finite, or a usage error (exit 2): NaN and negative timeouts make no sense."""
    if value is None:
        return None
    import math

    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"expected a positive number of seconds, got {value!r}")
    return value


def _print(renderable) -> None:
    from rich.console import Console

    Console().print(renderable)


@click.group(name="twin")
def command() -> None:
    """The local PD twin: prefill (sglang's real bootstrap loop), decode, router on 127.0.0.1."""


def _inventory_target(func):
    """``TARGET`` (the inventory file or the directory ``twin up`` printed) or ``--inventory FILE``."""
    func = click.option("--inventory", type=click.Path(dir_okay=False), default=None, help=INVENTORY_HELP)(func)
    return click.argument("target", required=False, type=click.Path())(func)


def _resolve(target: str | None, inventory: str | None) -> str:
    """The inventory file meant: ``--inventory``, or TARGET itself, or TARGET/inventory.toml."""
    from forensics.twin.api import INVENTORY_NAME  # the same name for the twin and the real engine

    if inventory and target and Path(target) != Path(inventory):
        raise click.UsageError(f"two deployments given: {target!r} and --inventory {inventory!r}; give one")
    chosen = inventory or target
    if chosen is None:
        raise click.UsageError("which deployment? give its inventory file or its directory (both printed by "
                               "'forensics twin up'), as TARGET or --inventory FILE, "
                               "e.g. 'forensics twin down /tmp/twin-0.5.15-x'")
    path = Path(chosen)
    return str(path / INVENTORY_NAME) if path.is_dir() else str(path)


def _down_command(inventory: Path) -> str:
    import shlex

    return f"forensics twin down {shlex.quote(str(inventory))}"


def _attach(inventory: str):
    """The deployment an inventory describes: the twin, or the real engine (``[twin] engine = "sglang"``)."""
    from forensics.inventory import InventoryError, load

    try:
        engine = load(inventory).twin.get("engine")
    except InventoryError:
        engine = None  # the twin's attach reports what is wrong with the file, as before
    if engine == "sglang":
        from forensics.engine import deployment

        return deployment.attach(inventory)
    from forensics.twin import api

    return api.attach(inventory)


@command.command()
@click.option("--engine", type=click.Choice(["twin", "sglang"]), default="twin", show_default=True,
              help="twin: this project's processes around sglang's bootstrap loop; sglang: the real engine")
@click.option("--model", "model_size", type=click.Choice(["tiny", "slow-prefill"]), default=None,
              help="the model the real engine serves (--engine sglang; default tiny)")
@click.option("--sglang", "version", default="0.5.15", show_default=True, help="sglang release to run")
@click.option("--decode-sglang", "decode_version", default=None,
              help="the decode's release, when it differs (a rolling upgrade); the pair's frames are checked first")
@click.option("--patched", is_flag=True, help="patch the twin's copy of nixl/conn.py with the codemod")
@click.option("--backend", type=click.Choice(["nixl", "mooncake"]), default="nixl", show_default=True)
@click.option("--base-port", type=int, default=None, help="router N, prefill N+1, bootstrap N+2, decode N+3")
@click.option("--waiting-timeout", type=float, default=None, callback=_waiting_timeout,
              help="decode waiting timeout, s, positive (sglang: 300)")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, help="twin directory")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def up(engine, model_size, version, decode_version, patched, backend, base_port, waiting_timeout, directory,
       as_json) -> None:
    """Start a twin (or the real engine: --engine sglang) and print its URLs and inventory."""
    from forensics.inventory.twin_table import DEFAULT_WAITING_TIMEOUT_S

    waiting = DEFAULT_WAITING_TIMEOUT_S if waiting_timeout is None else waiting_timeout
    if engine == "sglang":
        from forensics.engine import deployment as real

        progress = None if as_json else (lambda step: click.echo(f"engine environment: {step}", err=True))
        deployment = real.up(version, patched=patched, backend=backend, base_port=base_port, waiting_timeout=waiting,
                             directory=directory, decode_sglang=decode_version, model_size=model_size or "tiny",
                             progress=progress)
    else:
        if model_size is not None:
            raise click.UsageError("--model: only the real engine (--engine sglang) serves a model")
        from forensics.twin import api

        deployment = api.up(version, patched=patched, backend=backend, base_port=base_port, waiting_timeout=waiting,
                            directory=directory, decode_sglang=decode_version)
    data = dict(deployment.urls(), engine=engine, sglang=version, decode_sglang=decode_version or version,
                patched=patched,
                backend=backend, pair=deployment.pair,
                directory=str(deployment.directory), timings_s=deployment.timings,
                pids={role: deployment.pid(role) for role in ("prefill", "decode", "router")})
    data["inventory"] = str(deployment.inventory_path)
    data["down_command"] = _down_command(deployment.inventory_path)

    def human() -> None:
        _print(deployment)
        if deployment.pair:
            from forensics.twin.pair import PairCheck

            click.echo(PairCheck(**{k: v for k, v in deployment.pair.items() if k != "servable"}).summary())
        click.echo(f"inventory: {deployment.inventory_path}")
        click.echo(f"it runs until: {data['down_command']}")

    conclude(as_json, GOOD, data, human, word="up")


@command.command()
@_inventory_target
@click.option("--json", "as_json", is_flag=True)
def status(target, inventory, as_json) -> None:
    """Is each process alive and answering; is the prefill's bootstrap thread alive? (exit 1 if not)

    TARGET: the twin's inventory file or its directory (or --inventory FILE)."""
    inventory = _resolve(target, inventory)
    report = _attach(inventory).status()
    healthy = report.healthy
    document = dict(report.to_dict(), healthy=healthy)

    def human() -> None:
        # The verdict line first (healthy, or what is wrong), then per role: pid, URL, alive,
        # answering, bootstrap thread alive or DEAD, queue gauges.
        _print(report)

    conclude(as_json, GOOD if healthy else BAD, document, human, word="healthy" if healthy else "unhealthy")


@command.command()
@click.argument("role", type=click.Choice(["prefill", "decode", "router", "all"]), default="all")
@_inventory_target
@click.option("--json", "as_json", is_flag=True)
def restart(role, target, inventory, as_json) -> None:
    """Restart one role (what 'systemctl restart' is for a live host).

    TARGET: the twin's inventory file or its directory (or --inventory FILE)."""
    inventory = _resolve(target, inventory)
    deployment = _attach(inventory)
    # restart() raises (exit 4) when a role does not come back ready; then check what runs now.
    seconds = deployment.restart(role)
    report = deployment.status()
    roles = ("prefill", "decode", "router") if role == "all" else (role,)
    down = [name for name in roles
            if not (report["roles"][name]["alive"] and report["roles"][name]["answering"])]
    data = {"restarted": role, "seconds": round(seconds, 3), "inventory": str(Path(inventory)),
            "not_answering": down}
    message = (f"restarted {role} in {seconds:.2f}s" if not down
               else f"restarted {role}, but not answering now: {', '.join(down)}")
    conclude(as_json, BAD if down else GOOD, data, lambda: _print(message),
             word="failed" if down else "restarted")


@command.command()
@_inventory_target
@click.option("--json", "as_json", is_flag=True)
def down(target, inventory, as_json) -> None:
    """Stop every process of the twin (exit 1 if any is still running afterwards).

    TARGET: the twin's inventory file or its directory (or --inventory FILE)."""
    inventory = _resolve(target, inventory)
    deployment = _attach(inventory)
    pids = {role: deployment.pid(role) for role in ("prefill", "decode", "router")}
    report = deployment.take_down()
    still = report["still_running"]
    data = dict(report, inventory=str(Path(inventory)))
    message = f"stopped: {', '.join(report['stopped']) or 'nothing was running'}"
    if report["recovered"]:
        message += (f"; {', '.join(report['recovered'])}: the pid record was stale, the real process was found by "
                    "its log file and port, and stopped")
    if report["stale"]:
        stale = ", ".join(f"{role} (pid {pids[role]})" for role in report["stale"])
        message += (f"; stale pid file(s), removed without a signal: {stale} "
                    "(not a process this twin started)")
    for role, ports in report["listening"].items():
        message += (f"; {role}: the pid record (pid {pids[role]}) is stale and port(s) "
                    f"{', '.join(map(str, ports))} still listen, held by no process provably this twin's: "
                    "nothing signalled, record kept")
    if report.get("killed"):
        message += (f"; SIGKILLed after the stop timeout: {', '.join(report['killed'])} "
                    "(did not finish its SIGTERM)")
    if report.get("environment_in_use"):
        message += (f"; kept the engine environment: pid(s) {', '.join(map(str, report['environment_in_use']))} "
                    "still run from it, and no record proves them this deployment's (nothing signalled)")
    if report.get("removed_environment"):
        message += f"; removed its engine environment {report['removed_environment']}"
    if report["removed_directory"]:
        message += f"; removed the twin's directory {report['removed_directory']}"
    if still:
        message += f"; still running: {', '.join(still)}"
    failed = bool(still or report.get("environment_in_use"))
    conclude(as_json, BAD if failed else GOOD, data, lambda: _print(message), word="failed" if failed else "down")


@command.command()
@click.option("--sglang", "version", default="0.5.15", show_default=True, help="sglang release of both sides")
@click.option("--real-inventory", type=click.Path(dir_okay=False, exists=True), default=None,
              help="a running real-engine deployment's inventory ('twin up --engine sglang'); default: start one")
@click.option("--real-capture", type=click.Path(dir_okay=False, exists=True), default=None,
              help="a stored capture of the real engine (JSON, e.g. tests/data/real-engine-0.5.15/capture.json)")
@click.option("--twin-inventory", type=click.Path(dir_okay=False, exists=True), default=None,
              help="a running twin's inventory; default: start one")
@click.option("--save-real", type=click.Path(dir_okay=False), default=None, help="write the real side's capture here")
@click.option("--raw", "raw_dir", type=click.Path(file_okay=False), default=None,
              help="keep each side's raw material (/metrics pages, answers, py-spy dumps) here")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def fidelity(version, real_inventory, real_capture, twin_inventory, save_real, raw_dir, as_json) -> None:
    """Compare the twin with the real engine of the same release: logs, /metrics, endpoints,
    processes, threads. Exit 0 no differences but the documented allowed ones, 1 differences,
    3 a side could not be captured, 4 a side could not be started."""
    from forensics.fidelity.check import check

    if real_inventory and real_capture:
        raise click.UsageError("give --real-inventory or --real-capture, not both")
    report = check(version, real=real_capture or real_inventory, twin=twin_inventory, raw_dir=raw_dir,
                   save_real=save_real)
    status = report.exit_status
    conclude(as_json, status, report.to_dict(), lambda: click.echo(report.text()),
             word="faithful" if status == GOOD else "differences")
