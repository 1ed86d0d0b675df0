"""Two backends' loops side by side, aligned by tag: what one handles that the other does not.

``diff(release, "nixl", "mooncake")`` answers the 3 a.m. question from the source: for every
tag either side sends (and an unknown one), what each backend's loop of the receiving role
does with it, with the deciding lines of both loops next to each other. A tag only one
backend sends is still tried on the other's loop (with the sender's frame shape), so the
table shows what Mooncake would do with a frame NIXL dies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.handlers.dispatch import foreign_shape, run_frame
from forensics.handlers.model import DIES, HANDLED, PREFILL, ROLES, Finding, FrameShape, Outcome

NOT_SENT = "not sent"


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
        fates = {cell.fate for cell in self.cells.values()}
        return len(fates) > 1 or DIES in fates


@dataclass
class HandlerDiff:
    version: str
    a: str
    b: str
    rows: list[DiffRow]
    loops: dict[str, dict[str, str]]  # backend -> role -> "file:line function"
    protection: dict[str, dict[str, dict]]  # backend -> role -> daemon/wrapper/per-message try
    findings: list[Finding] = field(default_factory=list)

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
    index = handler_map._index
    backends = {name: handler_map.backend(name) for name in (a, b)}
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
        if not any(backend.loops_for(role) for backend in backends.values()):
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
            for name, backend in backends.items():
                cells[name] = _cell(index, backend, role, tag, shapes.get(tag))
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
    return HandlerDiff(handler_map.version, a, b, rows, loops, protection, relevant)


def _probe_shape(tag: str) -> FrameShape:
    """A frame with ``tag`` first and numbers after it (room, index, ...), six frames long."""
    from forensics.handlers.model import Element

    return FrameShape((Element("const", tag.encode()),) + (Element("num"),) * 5)


def _cell(index, backend, role: str, tag: str, shape: FrameShape | None) -> DiffCell:
    loops = backend.loops_for(role)
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
