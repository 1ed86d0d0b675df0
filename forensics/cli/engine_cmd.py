"""``forensics engine``: the real engine's own environment and models, prepared ahead of use.

``twin up --engine sglang`` builds what it lacks on first use; ``engine prepare`` does the same
up front (CI prepares before the tests run, an operator before a demo), with progress, and says
where each piece lives and how long it took.
"""

from __future__ import annotations

import time

import click

from forensics.cli.contract import conclude
from forensics.exitcodes import GOOD

MODEL_SIZES = ("tiny", "slow-prefill")


@click.group()
def command() -> None:
    """The real engine's environment: sglang, torch (CPU), NIXL and the router, per release."""


@command.command("prepare")
@click.argument("releases", nargs=-1)
@click.option("--model", "models", multiple=True, type=click.Choice(MODEL_SIZES),
              help="Build this local model (repeatable) [default: tiny and slow-prefill].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else there.")
def prepare_command(releases: tuple[str, ...], models: tuple[str, ...], as_json: bool) -> None:
    """Build (or verify) the engine environment of each RELEASE [default: 0.5.15] and the models."""
    from forensics.cli.render import console, step_progress
    from forensics.engine import environment, model

    prepared = []
    for release in releases or ("0.5.15",):
        started = time.monotonic()
        with step_progress(len(environment.STEPS), f"sglang {release} engine environment") as step:
            env = environment.prepare(release, progress=step)
        prepared.append({"release": release, "root": str(env.root), "python": str(env.python),
                         "seconds": round(time.monotonic() - started, 1), "steps": env.timings})
    built = []
    python = prepared[0]["python"]
    for size in models or MODEL_SIZES:
        started = time.monotonic()
        local = model.build(size, python)
        built.append({"size": size, "path": str(local.path), "parameters": local.parameters,
                      "seconds": round(time.monotonic() - started, 1)})

    def human() -> None:
        out = console()
        for entry in prepared:
            out.print(f"sglang {entry['release']}: {entry['root']} ({entry['seconds']} s)", soft_wrap=True)
        for entry in built:
            out.print(f"model {entry['size']}: {entry['parameters']:,} parameters, {entry['path']} "
                      f"({entry['seconds']} s)", soft_wrap=True)

    conclude(as_json, GOOD, {"environments": prepared, "models": built}, human)
