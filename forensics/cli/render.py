"""Shared terminal output for the CLI (rich consoles); JSON encoding lives in forensics.jsonable."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from forensics.jsonable import encode_json, frame_json, frame_records

__all__ = ["collection_progress", "console", "encode_json", "frame_json", "frame_records", "step_progress"]


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


@contextmanager
def step_progress(total: int | None, label: str) -> Iterator[Callable[[str], None]]:
    """A per-step callback for stderr: a rich bar in a terminal, one plain line per step otherwise
    (a log or CI job gets ``LABEL: STEP (3/45)`` lines instead of minutes of silence).
    ``total`` None: the number of steps is not known ahead (no bar length, no denominator)."""
    import click

    err = console(stderr=True)
    if not err.is_terminal:
        done = 0

        def line(step: str) -> None:
            nonlocal done
            done += 1
            click.echo(f"{label}: {step} ({done}/{total})" if total else f"{label}: {step} ({done})", err=True)

        yield line
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True)
    with progress:
        task = progress.add_task("", total=total)
        yield lambda step: progress.update(task, advance=1, description=step)


def collection_progress(as_json: bool):
    """(bar, update) for a live collection: a rich bar redrawn on one stderr line in a terminal
    (its clock runs while probes and metrics sample, so the screen is never blank), (None, None)
    under --json or in a pipe. ``update(what, done, total)`` is ``collect``'s progress callback."""
    import sys

    if as_json or not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), transient=True, console=console(stderr=True))
    task = bar.add_task("sampling probes and metrics", total=None)

    def update(what: str, done: int, total: int) -> None:
        bar.update(task, completed=done, total=total, description=f"collected {what}")

    return bar, update
