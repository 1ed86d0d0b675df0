"""The handler map: which message tags each backend's receiver loop handles, per release.

``map_release(source)`` maps one release or fork; ``diff(release, "nixl", "mooncake")``
puts two backends' loops side by side by tag; ``matrix(releases)`` maps many releases
into one DataFrame with a heatmap; ``check(source)`` is the CI gate: its map's
``verdict`` is "findings", "inconclusive" (something could not be read or understood,
listed with file and line in ``unreadable``) or "clean".

Everything is read from the release's own source with ``ast``; the vulnerable window
comes out of the analysis, not from a table of versions.
"""

from __future__ import annotations

from forensics.handlers.model import (
    CLEAN,
    CRITICAL,
    FINDINGS,
    INCONCLUSIVE,
    WARNING,
    Finding,
    Gap,
    Unreadable,
    UnreadableBackend,
    UnreadableSource,
)

__all__ = [
    "CLEAN",
    "CRITICAL",
    "FINDINGS",
    "INCONCLUSIVE",
    "WARNING",
    "Finding",
    "Gap",
    "Unreadable",
    "UnreadableBackend",
    "UnreadableSource",
    "check",
    "diff",
    "map_release",
    "matrix",
    "resolve_source",
]


def resolve_source(release):
    """A release number, a directory, ``installed`` or an ``SglangSource`` as an ``SglangSource``."""
    from forensics.sglang_source import SglangSource, resolve

    return release if isinstance(release, SglangSource) else resolve(str(release))


def map_release(release):
    """The :class:`~forensics.handlers.handler_map.HandlerMap` of one release or source tree.

    Example: ``fx.handlers.map_release("0.5.15").findings``
    """
    from forensics.handlers.handler_map import build

    return build(resolve_source(release))


def diff(release, a: str = "nixl", b: str = "mooncake", *, confirm: bool = False):
    """Two backends' loops aligned by tag (a :class:`~forensics.handlers.side_by_side.HandlerDiff`).

    With ``confirm=True`` each critical NIXL prefill finding is replayed in the engine
    sandbox and its word ("died: ...", "survived", "not confirmed (...)") is shown beside
    the static verdict.

    Example: ``fx.handlers.diff("0.5.15", "nixl", "mooncake", confirm=True).headline()``
    """
    from forensics.handlers.side_by_side import build_diff

    source = resolve_source(release)
    handler_map = map_release(source)
    findings = handler_map.findings
    if confirm:
        from forensics.handlers.confirm import confirm as replay

        findings = replay(handler_map, source, [f for f in findings if f.backend in (a, b)])
    return build_diff(handler_map, a, b, findings)


def matrix(releases=None, *, progress=None, **options):
    """Per release x backend (default: every 0.5.x release on PyPI): a :class:`~forensics.handlers.release_matrix.HandlerMatrix`.

    Releases not in the cache are fetched (about a minute for all of them the first time).
    ``progress`` says how that shows: None (the default) a tqdm bar under IPython or Jupyter
    and nothing from a plain script; True a bar anywhere; False nothing; a callable is called
    with each release once it is mapped. Other options (``workers``, ``use_cache``): see
    :func:`forensics.handlers.release_matrix.matrix`.

    Example: ``fx.handlers.matrix(["0.5.12.post1", "0.5.13", "0.5.16"]).window_text("nixl")``
    """
    from forensics.handlers.release_matrix import matrix as build_matrix
    from forensics.progress import step_reporter
    from forensics.sglang_source import available_releases

    if releases is None:
        releases = available_releases("0.5.1", "0.5.23")
    releases = list(releases)
    with step_reporter(progress, len(releases), "handlers matrix", unit="release") as step:
        return build_matrix(releases, progress=step, **options)


def check(release):
    """The CI gate over a release or fork: its :class:`~forensics.handlers.handler_map.HandlerMap`.

    Read ``.verdict`` ("findings", "inconclusive", "clean") and ``.exit_status`` (1, 3, 0),
    ``.findings`` and ``.unreadable`` (what could not be read or understood, with file and
    line). No findings alone does not mean clean. Raises
    :class:`~forensics.handlers.handler_map.NoDisaggregationCode` (INCONCLUSIVE) for a tree
    without disaggregation code.

    Example: ``fx.handlers.check("checkouts/sglang-fork").exit_status``
    """
    return map_release(release)
