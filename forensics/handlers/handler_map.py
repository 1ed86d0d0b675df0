"""The handler map of one release: per backend and role, its loops, what they do with each frame.

``build(source)`` parses the release's ``disaggregation`` package once and returns a
:class:`HandlerMap`: for every backend with a bootstrap loop, its receiver loops (own
or inherited), the messages its two sides send, and each message delivered to each
loop of the other side (:class:`Delivery`). Anything it could not find is a
:class:`Gap`, listed with the file and what was looked for; the rest of the map stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.handlers.dispatch import LoopCode, run_frame
from forensics.handlers.model import (
    DECODE,
    PREFILL,
    UNREAD,
    Delivery,
    Element,
    FrameShape,
    Gap,
    Outcome,
    ReceiverLoop,
    SentMessage,
)
from forensics.handlers.source_index import SourceIndex
from forensics.handlers.source_scan import (
    BackendClasses,
    backend_classes,
    evaluate_loop,
    find_loops,
    find_send_sites,
    has_bootstrap_timeout,
    loops_for_backend,
    senders_for_backend,
)
from forensics.sglang_source import SglangSource, SourceError

ABORT_PROBE = FrameShape((Element("const", b"ABORT"), Element("num"), Element("text"), Element("num")))
SKIPPED_BACKENDS = ("fake",)  # no sockets: health checks use it, nothing to map


class NoDisaggregationCode(SourceError):
    """The tree has no sglang disaggregation package (or no backend with a receiver loop)."""


@dataclass
class BackendMap:
    backend: str
    classes: BackendClasses
    loops: list[ReceiverLoop]
    sent: list[SentMessage]
    deliveries: list[Delivery]
    bootstrap_timeout: bool | None
    abort_probe: dict[str, Outcome] = field(default_factory=dict)  # prefill loop -> what an ABORT does
    _codes: dict[str, LoopCode] = field(default_factory=dict, repr=False)

    @property
    def inherits(self) -> str | None:
        return self.classes.parent_backend

    def loops_for(self, role: str) -> list[ReceiverLoop]:
        return [loop for loop in self.loops if loop.role == role]

    def sent_by(self, role: str) -> list[SentMessage]:
        return [m for m in self.sent if m.sender_role == role]

    def handles_abort(self) -> bool | None:
        """Whether every prefill loop handles an ABORT frame (sent or not); None without a prefill loop."""
        if not self.abort_probe:
            return None
        return all(o.fate == "handled" for o in self.abort_probe.values())

    def to_dict(self, with_source: bool = False) -> dict:
        return {
            "backend": self.backend,
            "manager": self.classes.manager,
            "sender_class": self.classes.sender,
            "receiver_class": self.classes.receiver,
            "inherits": self.inherits,
            "bootstrap_timeout": self.bootstrap_timeout,
            "handles_abort": self.handles_abort(),
            "loops": [loop.to_dict(with_source) for loop in self.loops],
            "sent": [m.to_dict() for m in self.sent],
            "deliveries": [d.to_dict() for d in self.deliveries],
        }


@dataclass
class HandlerMap:
    """Everything the analysis found in one release (or fork)."""

    version: str
    origin: str
    root: str
    backends: dict[str, BackendMap]
    gaps: list[Gap]
    _index: SourceIndex | None = field(default=None, repr=False)

    def backend(self, name: str) -> BackendMap:
        if name not in self.backends:
            raise KeyError(
                f"sglang {self.version} has no mapped backend {name!r} (mapped: {', '.join(self.backends) or 'none'})"
            )
        return self.backends[name]

    @property
    def findings(self) -> list:
        from forensics.handlers.findings import findings_of

        return findings_of(self)

    def to_dict(self, with_source: bool = False) -> dict:
        return {
            "version": self.version,
            "origin": self.origin,
            "root": self.root,
            "backends": {name: b.to_dict(with_source) for name, b in self.backends.items()},
            "findings": [f.to_dict() for f in self.findings],
            "gaps": [g.to_dict() for g in self.gaps],
        }

    def to_frame(self):
        """One row per (backend, receiver role, tag): who sends it and what the loop does with it."""
        import pandas as pd

        rows = []
        for backend in self.backends.values():
            for delivery in backend.deliveries:
                rows.append(
                    {
                        "backend": backend.backend,
                        "receiver_role": delivery.message.receiver_role,
                        "tag": delivery.message.tag,
                        "arity": "-".join(dict.fromkeys(str(a) for a in delivery.message.shape.arity)),
                        "sender": delivery.message.function,
                        "via": ", ".join(delivery.message.via),
                        "loop": delivery.loop.function if delivery.loop else None,
                        "fate": delivery.outcome.fate,
                        "detail": delivery.outcome.detail,
                        "line": f"{delivery.outcome.file}:{delivery.outcome.line}",
                    }
                )
        return pd.DataFrame(rows)

    def __rich__(self):
        from forensics.handlers.render import map_renderable

        return map_renderable(self)

    def _repr_html_(self) -> str:
        from forensics.handlers.render import map_html

        return map_html(self)


def build(source: SglangSource) -> HandlerMap:
    """Map every backend's receiver loops and senders in ``source``."""
    disaggregation = source.disaggregation
    if not disaggregation.is_dir():
        raise NoDisaggregationCode(
            f"{source.root}: no {disaggregation.relative_to(source.root)} directory "
            "(looked for sglang/srt/disaggregation/<backend>/conn.py)"
        )
    backends = [b for b in source.backends() if b not in SKIPPED_BACKENDS]
    if not backends:
        raise NoDisaggregationCode(
            f"{disaggregation}: no backend directory with a conn.py (looked for nixl/, mooncake/, mori/, ...)"
        )
    index = SourceIndex.load(disaggregation, backends)
    gaps: list[Gap] = list(index.gaps)
    found_loops = find_loops(index, gaps)
    sites = find_send_sites(index)
    mapped: dict[str, BackendMap] = {}
    for backend in backends:
        relpath = f"{backend}/conn.py"
        if relpath not in index.files:
            continue  # its parse error is already a gap
        classes = backend_classes(index, backend)
        if classes.manager is None:
            gaps.append(Gap(relpath, "a *KVManager class", "none defined; backend skipped"))
            continue
        loops: list[ReceiverLoop] = []
        codes: dict[str, LoopCode] = {}
        for found, inherited in loops_for_backend(index, backend, classes, found_loops):
            loop, code = evaluate_loop(index, found, backend, classes, inherited)
            loops.append(loop)
            codes[loop.function] = code
        if not loops:
            gaps.append(
                Gap(relpath, "a thread whose target loops over a ZMQ recv_multipart()",
                    f"{classes.manager} starts no receiver loop (own or inherited)")
            )
            continue
        sent = senders_for_backend(index, backend, classes, sites, found_loops, gaps)
        deliveries: list[Delivery] = []
        for message in sent:
            receivers = [loop for loop in loops if loop.role == message.receiver_role]
            if not receivers:
                deliveries.append(
                    Delivery(message, None, Outcome(UNREAD, f"{backend} runs no {message.receiver_role} receiver loop",
                                                    message.file, message.line))
                )
            for loop in receivers:
                outcome = _worst(run_frame(index, codes[loop.function], message.shape),
                                 run_frame(index, codes[loop.function], message.shape.full()))
                deliveries.append(Delivery(message, loop, outcome))
        abort_probe = {
            loop.function: run_frame(index, codes[loop.function], ABORT_PROBE) for loop in loops if loop.role == PREFILL
        }
        mapped[backend] = BackendMap(
            backend=backend,
            classes=classes,
            loops=loops,
            sent=sent,
            deliveries=deliveries,
            bootstrap_timeout=has_bootstrap_timeout(index, classes),
            abort_probe=abort_probe,
            _codes=codes,
        )
        for role in (PREFILL, DECODE):
            if not any(loop.role == role for loop in loops) and any(m.receiver_role == role for m in sent):
                gaps.append(Gap(relpath, f"a {role} receiver loop", f"{backend} sends to {role} but no loop reads there"))
    return HandlerMap(source.version, source.origin, str(source.root), mapped, gaps, index)


_SEVERITY = {"thread dies": 4, "dropped, exception logged": 3, "dropped with warning": 2, "dropped silently": 1}


def _worst(first: Outcome, second: Outcome) -> Outcome:
    return first if _SEVERITY.get(first.fate, 0) >= _SEVERITY.get(second.fate, 0) else second
