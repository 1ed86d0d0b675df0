"""The error lines sglang's own code can write in a PD deployment, read from each release's calls.

sglang's log prefix carries no level, so a line cannot say it is an error; the release's source
can. Every ``logger.error`` / ``exception`` / ``critical`` call (and ``warning`` in
``disaggregation/``) of the modules a PD deployment runs (:data:`PD_MODULES`: disaggregation, the
schedulers, tokenizer manager, detokenizer, engine, HTTP server, watchdog) is read with ``ast``
(:mod:`forensics.logs.source_messages`) and placed:

* ``catalogue``: its message, rendered with representative values, is a hand-written entry of
  ``signatures.toml`` (the entry says what it means and where it sits in the kill chain);
* ``derived``: no entry explains it, so it becomes an entry of its own, named by the area it comes
  from (:data:`AREAS`: in ``disaggregation/``, a class and a kill-chain step per area; elsewhere
  ``unclassified_error``), matched by its literal text with holes as wildcards. A log holding one is
  never clean;
* ``unrecognisable``: the message has too little literal text to be told from other lines
  (``logger.error(e)``, ``f"Error: {e}"``); :mod:`forensics.logs.error_placement` lists these so
  the count is visible.

The catalogue (:func:`forensics.logs.catalogue.derived_signatures`) loads the entries of the
releases of :data:`SHIPPED` whose source is in the wheel cache, and of any release ``forensics logs
--sglang X`` names. Each release's entries are derived once and kept beside its wheel (keyed by the
wheel's sha256), so a later run reads them without parsing; nothing of sglang is kept in this repo.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass

from packaging.version import Version

from forensics import sglang_source
from forensics.cache import cache_dir
from forensics.logs import source_messages as sm

# Relative to sglang/srt: the modules whose processes a PD deployment runs.
PD_MODULES = ("disaggregation/*.py", "disaggregation/**/*.py", "managers/scheduler.py", "managers/scheduler_*.py",
              "managers/scheduler_components/*.py", "managers/tokenizer_manager.py",
              "managers/detokenizer_manager.py", "entrypoints/engine.py", "entrypoints/http_server.py",
              "utils/watchdog.py", "utils/common.py", "utils/cudacore_pyspy_dump_utils.py")
DISAGGREGATION = "sglang/srt/disaggregation/"
LEVELS = ("error", "critical")
DISAGGREGATION_LEVELS = ("warning", "error", "critical")
SEVERITY = {"warning": "warning", "error": "error", "critical": "critical"}
# The releases whose error calls the catalogue knows when their source is in the wheel cache: the
# vulnerable window and the fixed releases after it (``forensics logs --sglang X`` adds any other).
SHIPPED = ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18",
           "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# A message must hold this many literal characters, in a run of at least MIN_RUN, to be told by its
# text from lines other code writes.
MIN_LITERAL = 16
MIN_RUN = 10
UNCLASSIFIED = "unclassified_error"
FORMAT = 1  # of the memo files; bump when an entry's fields or their derivation change


@dataclass(frozen=True)
class Area:
    """Where in ``disaggregation/`` a call sits, and what a line of it means there."""

    glob: str  # over the path from sglang/srt/
    name: str  # the class stem: "<name>_error" / "<name>_warning"
    step: str  # the kill-chain step of its errors (its warnings are context)
    meaning: str


AREAS = (
    Area("disaggregation/decode*.py", "decode_disaggregation", "fallout",
         "the decode's PD queues (prealloc, transfer, waiting) logged it: a request's KV did not arrive as planned"),
    Area("disaggregation/prefill.py", "prefill_disaggregation", "fallout",
         "the prefill's PD queues (bootstrap, inflight) logged it: a request's KV was not sent as planned"),
    Area("disaggregation/*/conn.py", "kv_backend", "fallout",
         "the KV transfer backend (its bootstrap server, transfer workers or the decode's listener) logged it"),
    Area("disaggregation/*", "disaggregation", "fallout",
         "sglang's disaggregation support (utilities, KV events, the fake or encoder paths) logged it"),
)


@dataclass(frozen=True)
class ErrorCall:
    """One logging call of a release at error level (warning in disaggregation/), with one message."""

    release: str
    file: str  # sglang/srt/...
    line: int
    method: str
    template: sm.Template
    constants: tuple = ()  # the module's string constants (NIXL's GUARD), for rendering

    @property
    def level(self) -> str:
        return sm.LEVELS[self.method]

    @property
    def shown(self) -> str:
        return sm.shown(self.template)

    @property
    def rendering(self) -> str:
        return sm.render(self.template, sm.GENERIC_FAILURE, dict(self.constants)).split("\n", 1)[0]

    @property
    def pattern(self) -> str:
        return sm.pattern(self.template).replace(".*?", ".*")

    @property
    def literal(self) -> str:
        return max(_runs(self.pattern), key=len, default="")

    @property
    def recognisable(self) -> bool:
        return sum(map(len, _runs(self.pattern))) >= MIN_LITERAL and len(self.literal) >= MIN_RUN

    @property
    def area(self) -> Area | None:
        relative = self.file.removeprefix("sglang/srt/")
        return next((a for a in AREAS if fnmatch.fnmatchcase(relative, a.glob)), None) \
            if self.file.startswith(DISAGGREGATION) else None

    @property
    def class_id(self) -> str:
        area = self.area
        if area is None:
            return UNCLASSIFIED
        return f"{area.name}_{'warning' if self.level == 'warning' else 'error'}"


def derived_ids() -> tuple[str, ...]:
    """Every id a derived entry can have: each area's error and warning class, and unclassified_error."""
    return tuple(f"{a.name}_{kind}" for a in AREAS for kind in ("error", "warning")) + (UNCLASSIFIED,)


def _runs(pattern: str) -> list[str]:
    """The literal runs of a derived pattern (escaped text between ``.*`` holes), unescaped."""
    return [re.sub(r"\\(.)", r"\1", run) for run in pattern.split(".*") if run]


def pd_files(source: sglang_source.SglangSource) -> list[str]:
    """The release's PD modules, as paths from the source root, sorted."""
    found = set()
    for glob in PD_MODULES:
        found.update(str(p.relative_to(source.root)) for p in source.srt.glob(glob) if p.is_file())
    return sorted(found)


def error_calls(source: sglang_source.SglangSource) -> list[ErrorCall]:
    """Every error-level call (warning in disaggregation/) of the release's PD modules, one per message."""
    calls = []
    for relative in pd_files(source):
        messages = sm.ModuleMessages(source.tree(relative))
        levels = DISAGGREGATION_LEVELS if relative.startswith(DISAGGREGATION) else LEVELS
        constants = tuple(sorted((k, v) for k, v in messages.constants.items() if isinstance(v, str)))
        for call in messages.log_calls():
            if call.level in levels:
                for template in call.templates:
                    calls.append(ErrorCall(source.version, relative, call.line, call.method, template, constants))
    return calls


def step_of(call: ErrorCall) -> str:
    area = call.area
    return "context" if area is None or call.level == "warning" else area.step


# --------------------------------------------------------------------------- catalogue entries


def release_entries(version: str, *, offline: bool = True) -> list[dict]:
    """The recognisable error calls of release ``version``, one dict per distinct message (its
    class ``id``, ``severity``, ``step``, ``file``, ``lines``, ``pattern``, ``literal``, ``rendering``
    and the area's ``meaning``), derived from its source once and kept beside the wheel cache, keyed
    by the wheel's sha256. Raises :class:`~forensics.sglang_source.SourceError` when the release
    cannot be had."""
    digest = sglang_source.wheel_sha256(version)
    if digest is not None:
        try:
            return json.loads(_memo(version, digest).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass  # none yet, or damaged: derived again
    merged: dict[tuple, tuple[ErrorCall, list[int]]] = {}
    for call in error_calls(sglang_source.fetch(version, offline=offline)):
        if call.recognisable:
            merged.setdefault((call.class_id, call.file, call.pattern), (call, []))[1].append(call.line)
    entries = [{"id": call.class_id, "severity": SEVERITY[call.level], "level": call.level, "step": step_of(call),
                "file": call.file, "lines": sorted(set(lines)), "pattern": call.pattern, "literal": call.literal,
                "rendering": call.rendering, "meaning": call.area.meaning if call.area else None}
               for call, lines in merged.values()]
    digest = sglang_source.wheel_sha256(version)
    if digest is not None:
        memo = _memo(version, digest)
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f".{memo.name}.{os.getpid()}")
        partial.write_text(json.dumps(entries), encoding="utf-8")
        os.replace(partial, memo)  # a reader beside this one sees the whole file or none
    return entries


def _memo(version: str, digest: str):
    return cache_dir() / "sglang-errors" / f"{version}-{digest[:16]}-v{FORMAT}.json"


def catalogue_entries(releases: tuple[str, ...]) -> list[dict]:
    """The entries of every release of ``releases``, one per pattern across them: ``releases`` the
    range it is written in, ``meaning`` where (file, line per release) and what its area means. A
    message written in two areas (the decode's and the prefill's "exceeds the maximum number of
    tokens") cannot say which wrote it: it is the broader class, at the higher level."""
    merged: dict[str, dict] = {}
    for version in releases:
        for entry in release_entries(version):
            found = merged.setdefault(entry["pattern"], {"pattern": entry["pattern"], "literal": entry["literal"],
                                                         "rendering": entry["rendering"], "calls": {}})
            call = found["calls"].setdefault((entry["id"], entry["file"]), dict(entry, at={}))
            call["at"][version] = entry["lines"]
    return [_one_entry(found) for found in merged.values()]


def _one_entry(found: dict) -> dict:
    calls = list(found["calls"].values())
    level = max((c["level"] for c in calls), key=("warning", "error", "critical").index)
    ids = {c["id"] for c in calls}
    if len(ids) == 1:
        name, step, area = calls[0]["id"], calls[0]["step"], calls[0]["meaning"]
    else:
        every_disaggregation = all(c["file"].startswith(DISAGGREGATION) for c in calls)
        broad = AREAS[-1]
        name = (f"{broad.name}_{'warning' if level == 'warning' else 'error'}" if every_disaggregation
                else UNCLASSIFIED)
        step = broad.step if every_disaggregation and level != "warning" else "context"
        area = broad.meaning if every_disaggregation else None
    versions = sorted({v for c in calls for v in c["at"]}, key=Version)
    places = []
    for c in calls:
        where = "; ".join(f"{'/'.join(map(str, lines))} in {', '.join(vs)}" for lines, vs in _by_lines(c["at"]))
        places.append(f"{c['file'].removeprefix('sglang/srt/')}: {where}")
    said = f"sglang logs this at {level} level ({' | '.join(places)})"
    meaning = f"{said}: {area}" if area else f"{said}; no catalogue entry explains it yet: read it with the lines around it"
    return {"id": name, "severity": SEVERITY[level], "step": step, "meaning": meaning,
            "releases": f">={versions[0]},<={versions[-1]}", "files": sorted({c["file"] for c in calls}),
            "pattern": found["pattern"], "literal": found["literal"], "rendering": found["rendering"]}


def _by_lines(at: dict[str, list[int]]) -> list[tuple[list[int], list[str]]]:
    groups: dict[tuple, list[str]] = {}
    for version in sorted(at, key=Version):
        groups.setdefault(tuple(at[version]), []).append(version)
    return [(list(lines), versions) for lines, versions in groups.items()]


def cached_releases(releases: tuple[str, ...] = SHIPPED) -> tuple[str, ...]:
    """The releases of ``releases`` whose source is in the wheel cache (no network, no tree walk)."""
    return tuple(v for v in releases if sglang_source.wheel_sha256(v) is not None)


def prepare(releases: tuple[str, ...] = SHIPPED, progress=print) -> None:
    """Fetch each release's source and derive its entries now (``./run test`` does, before pytest),
    so that every process of a run holds the same catalogue."""
    for version in releases:
        started = len(release_entries(version, offline=False))
        progress(f"sglang {version}: {started} error calls known")


if __name__ == "__main__":
    import sys

    prepare(tuple(sys.argv[1:]) or SHIPPED, progress=lambda text: print(text, file=sys.stderr))
