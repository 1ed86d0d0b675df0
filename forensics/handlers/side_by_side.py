"""Two backends' loops side by side, aligned by tag: what one handles that the other does not.

``diff(release, "nixl", "mooncake")`` answers the 3 a.m. question from the source: for every
tag either side sends (and an unknown one), what each backend's loop of the receiving role
does with it, with the deciding lines of both loops next to each other. A tag only one
backend sends is still tried on the other's loop (with the sender's frame shape), so the
table shows what Mooncake would do with a frame NIXL dies on.

A backend whose code could not be read shows "not read" in every cell, and a loop the
analysis did not understand shows "not understood", each with the file and line: neither
ever reads as handling what it is sent. ``verdict`` says findings, inconclusive or clean.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.exitcodes import ExitStatus
from forensics.handlers.loops import foreign_shape, run_frame
from forensics.handlers.model import (
    CLEAN,
    DIES,
    FINDINGS,
    HANDLED,
    INCONCLUSIVE,
    NOT_READ,
    NOT_UNDERSTOOD,
    PREFILL,
    ROLES,
    VERDICT_STATUS,
    Finding,
    FrameShape,
    Outcome,
    Unreadable,
    opposite,
)

NOT_SENT = "not sent"
BACKEND_NAMES = {"nixl": "NIXL", "mooncake": "Mooncake", "mori": "MORI", "ascend": "Ascend"}


def backend_name(backend: str) -> str:
    """How a backend is written in a sentence: NIXL, Mooncake (unknown ones as they are)."""
    return BACKEND_NAMES.get(backend, backend)


def finding_sentence(finding: Finding) -> str:
    """The one sentence a finding comes down to, e.g. "the decode sends ABORT, the NIXL prefill
    loop has no case for it: thread dies", with the sandbox's word when it was checked."""
    from forensics.handlers.findings import UNHANDLED

    loop = f"the {backend_name(finding.backend)} {finding.receiver_role} loop"
    if finding.kind == UNHANDLED:
        sentence = f"the {opposite(finding.receiver_role)} sends {finding.tag}, {loop} has no case for it: {finding.fate}"
    else:
        sentence = f"{loop} has no case for a frame it does not know (foreign or newer traffic): {finding.fate}"
    if finding.conditions:
        sentence += f" (on some paths: {len(finding.conditions)} condition(s), see the findings)"
    if finding.confirmation and finding.confirmation != "not checked":
        sentence += f"; sandbox: {finding.confirmation.split(':')[0]}"
    if finding.caveat:
        sentence += f" (not decisive: {finding.caveat})"
    return sentence


@dataclass
class DiffCell:
    backend: str
    fate: str
    detail: str
    summary: str
    source: str
    location: str
    sent: bool  # whether this backend's own other side sends the tag
    conditional: bool = False

    def text(self) -> str:
        words = self.fate
        if self.summary and self.fate == HANDLED:
            words += f": {self.summary}"
        elif self.detail:
            words += f": {self.detail}"
        if not self.sent:
            words += " (this backend never sends it)"
        return words

    def to_dict(self) -> dict:
        return {
            "fate": self.fate,
            "detail": self.detail,
            "summary": self.summary,
            "location": self.location,
            "sent": self.sent,
            "conditional": self.conditional,
            "source": self.source,
        }


@dataclass
class DiffRow:
    role: str
    tag: str
    senders: list[str]
    cells: dict[str, DiffCell]

    @property
    def gap(self) -> bool:
        """A GAP: the backends treat a frame differently, and it matters for one that really gets it.

        True when some backend's loop *really receives* this frame (its own other side sends the
        tag, or it is the unknown-frame row: foreign traffic reaches any loop), does not handle it
        (the thread dies, or the frame is dropped), and the other backend's loop does something
        else with it (e.g. NIXL's prefill dies on the decode's ABORT, Mooncake's handles it).
        Not a GAP: a tag only one backend sends, which the other would choke on but never gets (a
        wire-format difference); both loops doing the same (both dying is a finding, shown in the
        red cells and the findings, but not a difference); a cell not read or not understood (an
        unknown, shown grey and named, never a claim either way).
        """
        cells = list(self.cells.values())
        if len(cells) < 2 or any(c.fate in (NOT_READ, NOT_UNDERSTOOD) for c in cells):
            return False
        for cell in cells:
            if not cell.sent or cell.fate == HANDLED:
                continue
            if any(other.fate != cell.fate for other in cells if other is not cell):
                return True
        return False


@dataclass
class HandlerDiff:
    version: str
    a: str
    b: str
    rows: list[DiffRow]
    loops: dict[str, dict[str, str]]  # backend -> role -> "file:line function"
    protection: dict[str, dict[str, dict]]  # backend -> role -> daemon/wrapper/per-message try
    findings: list[Finding] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)  # of a, b and the shared files

    @property
    def verdict(self) -> str:
        """"findings" (a finding on an understood loop of a or b), else "inconclusive" (a part of
        either not read or not understood), else "clean"."""
        if any(f.certain for f in self.findings):
            return FINDINGS
        if self.unreadable or self.findings:
            return INCONCLUSIVE
        return CLEAN

    @property
    def exit_status(self) -> ExitStatus:
        return VERDICT_STATUS[self.verdict]

    def headline(self) -> list[str]:
        """The findings in one sentence each, the ones that decide first (a sent tag a loop has
        no case for, then loops that die on unknown frames); what to read before the table."""
        from forensics.handlers.findings import UNHANDLED

        ordered = sorted(self.findings, key=lambda f: (not f.certain, f.kind != UNHANDLED, f.backend != self.a,
                                                       f.backend, f.receiver_role, f.tag))
        sentences = [finding_sentence(f) for f in ordered]
        if not sentences:
            if self.unreadable:
                sentences = [f"no finding in what was read; {len(self.unreadable)} part(s) not read or "
                             "not understood, so this is not clean"]
            else:
                sentences = [f"every tag {backend_name(self.a)} or {backend_name(self.b)} sends is handled by "
                             "the receiving loop"]
        return sentences

    def to_frame(self):
        import pandas as pd

        records = []
        for row in self.rows:
            record = {"role": row.role, "tag": row.tag}
            for name in (self.a, self.b):
                record[name] = row.cells[name].text()
            record["gap"] = row.gap
            records.append(record)
        return pd.DataFrame(records).set_index(["role", "tag"])

    def gaps(self) -> list[DiffRow]:
        return [row for row in self.rows if row.gap]

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict,
            "unreadable": [u.to_dict() for u in self.unreadable],
            "loops": self.loops,
            "protection": self.protection,
            "rows": [
                {
                    "role": row.role,
                    "tag": row.tag,
                    "senders": row.senders,
                    "gap": row.gap,
                    "cells": {name: cell.to_dict() for name, cell in row.cells.items()},
                }
                for row in self.rows
            ],
            "findings": [f.to_dict() for f in self.findings],
        }

    def __rich__(self):
        from forensics.handlers.render import diff_renderable

        return diff_renderable(self)

    def _repr_html_(self) -> str:
        from forensics.handlers.render import diff_html

        return diff_html(self)

    def text(self, width: int = 160) -> str:
        from rich.console import Console

        console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
        console.print(self)
        return console.export_text()


def build_diff(handler_map, a: str, b: str, findings: list[Finding] | None = None) -> HandlerDiff:
    """The diff of ``a`` and ``b``. A backend whose code is there but could not be read gets a
    column of "not read" cells; one that is not in the tree at all raises KeyError."""
    index = handler_map._index
    unread: dict[str, list[Unreadable]] = {}
    for name in (a, b):
        if name not in handler_map.backends:
            blind = [u for u in handler_map.unreadable if u.backend == name]
            if not blind:
                handler_map.backend(name)  # raises KeyError: no such backend in this tree
            unread[name] = blind
    backends = {name: handler_map.backends[name] for name in (a, b) if name not in unread}
    rows: list[DiffRow] = []
    for role in ROLES:
        shapes: dict[str, FrameShape] = {}
        senders: dict[str, list[str]] = {}
        for name, backend in backends.items():
            for message in backend.sent:
                if message.receiver_role != role:
                    continue
                shapes.setdefault(message.tag, message.shape)
                senders.setdefault(message.tag, [])
                label = f"{name}: {message.function.split('.')[-1]}"
                if label not in senders[message.tag]:
                    senders[message.tag].append(label)
        if not any(backend.loops_for(role) for backend in backends.values()) and not unread:
            continue
        # Tags a loop has a case for but nobody here was seen sending (staging, newer peers): tried too.
        for backend in backends.values():
            for loop in backend.loops_for(role):
                for branch in loop.branches:
                    if branch.kind not in ("tag", "helper"):
                        continue
                    for tag in branch.tags:
                        if tag not in shapes and not tag.endswith("Guard") and tag not in ("None",):
                            shapes[tag] = _probe_shape(tag)
        tags = sorted(shapes, key=lambda t: (t.startswith("<"), t))
        for tag in [*tags, "<unknown tag>"]:
            cells = {}
            for name in (a, b):
                if name in unread:
                    cells[name] = _not_read_cell(name, unread[name])
                else:
                    cells[name] = _cell(index, backends[name], role, tag, shapes.get(tag))
            rows.append(DiffRow(role, tag, senders.get(tag, ["(nobody: a foreign or newer frame)"]), cells))
    loops = {
        name: {loop.role: f"{loop.file}:{loop.line} {loop.function}" for loop in backend.loops}
        for name, backend in backends.items()
    }
    protection = {
        name: {
            loop.role: {"daemon": loop.daemon, "wrapper": loop.wrapper, "per_message_try": loop.per_message_try,
                        "started_at": loop.started_at}
            for loop in backend.loops
        }
        for name, backend in backends.items()
    }
    chosen = findings if findings is not None else handler_map.findings
    relevant = [f for f in chosen if f.backend in (a, b)]
    blind = [u for u in handler_map.unreadable if u.backend in (a, b, None)]
    return HandlerDiff(handler_map.version, a, b, rows, loops, protection, relevant, blind)


def _not_read_cell(name: str, unreadable: list[Unreadable]) -> DiffCell:
    first = unreadable[0]
    return DiffCell(backend=name, fate=NOT_READ, detail=f"{first.where}: {first.reason}", summary="", source="",
                    location=first.where, sent=True)


def _probe_shape(tag: str) -> FrameShape:
    """A frame with ``tag`` first and numbers after it (room, index, ...), six frames long."""
    from forensics.handlers.model import Element

    return FrameShape((Element("const", tag.encode()),) + (Element("num"),) * 5)


def _cell(index, backend, role: str, tag: str, shape: FrameShape | None) -> DiffCell:
    loops = backend.loops_for(role)
    if not loops and role == PREFILL:
        # Every backend's prefill runs a bootstrap loop: not finding it is the analysis's blind spot.
        return DiffCell(backend.backend, NOT_READ, f"no {role} receiver loop of {backend.backend} was recognised",
                        "", "", "", True)
    if not loops:
        return DiffCell(backend.backend, "no reader", f"{backend.backend} runs no {role} loop", "", "", "", False)
    loop = loops[0]
    code = backend._codes[loop.function]
    own = [d for d in backend.deliveries if d.message.tag == tag and d.loop is loop]
    if own:
        outcome = max((d.outcome for d in own), key=lambda o: o.fate == DIES)
        sent = True
    else:
        probe = shape if shape is not None else foreign_shape(4)
        outcome = run_frame(index, code, probe)
        sent = tag == "<unknown tag>"
    if not loop.understood:
        # What the analysis would say is a guess here: name what it could not interpret instead.
        first = loop.not_understood[0]
        more = f" (and {len(loop.not_understood) - 1} more)" if len(loop.not_understood) > 1 else ""
        return DiffCell(
            backend=backend.backend,
            fate=NOT_UNDERSTOOD,
            detail=f"{first.where}: {first.reason}{more}",
            summary="",
            source=outcome.source,
            location=first.where,
            sent=sent if tag != "<unknown tag>" else True,
            conditional=outcome.conditional,
        )
    return DiffCell(
        backend=backend.backend,
        fate=outcome.fate,
        detail=outcome.detail,
        summary=_branch_summary(loop, outcome),
        source=outcome.source,
        location=f"{outcome.file}:{outcome.line}",
        sent=sent if tag != "<unknown tag>" else True,
        conditional=outcome.conditional,
    )


def _branch_summary(loop, outcome: Outcome) -> str:
    for branch in loop.branches:
        if branch.file == outcome.file and branch.line <= outcome.line <= branch.end_line:
            return branch.summary
    return ""


__all__ = ["HandlerDiff", "build_diff", "PREFILL"]
