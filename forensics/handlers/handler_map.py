"""The handler map of one release: per backend and role, its loops, what they do with each frame.

``build(source)`` parses the release's ``disaggregation`` package once and returns a
:class:`HandlerMap`: for every backend with a bootstrap loop, its receiver loops (own
or inherited), the messages its two sides send, and each message delivered to each
loop of the other side (:class:`Delivery`). Anything it could not find is a
:class:`Gap`, listed with the file and what was looked for; the rest of the map stands.

What could not be read or understood (a ``conn.py`` that does not parse, a backend whose
receiver loop was not found, a loop construct the interpreter does not model) is also an
:class:`~forensics.handlers.model.Unreadable` with file and line, in ``unreadable``; the
map's :attr:`HandlerMap.verdict` is then never "clean".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.exitcodes import ExitStatus, Undecided
from forensics.handlers.dispatch import Opaque
from forensics.handlers.loops import LoopCode, run_frame
from forensics.handlers.model import (
    ANALYSIS_ERROR,
    CLEAN,
    DECODE,
    FINDINGS,
    INCONCLUSIVE,
    NO_LOOP,
    NO_MANAGER,
    NO_READER,
    PREFILL,
    UNREAD,
    VERDICT_STATUS,
    Delivery,
    Element,
    FrameShape,
    Gap,
    Outcome,
    ReceiverLoop,
    SentMessage,
    Unreadable,
    UnreadableBackend,
    UnreadableSource,
    describe_unreadable,
)
from forensics.handlers.senders import find_send_sites, has_bootstrap_timeout, senders_for_backend
from forensics.handlers.source_index import SourceIndex
from forensics.handlers.source_scan import (
    BackendClasses,
    backend_classes,
    evaluate_loop,
    find_loops,
    loops_for_backend,
    not_understood,
)
from forensics.sglang_source import SglangSource, SourceError

ABORT_PROBE = FrameShape((Element("const", b"ABORT"), Element("num"), Element("text"), Element("num")))
SKIPPED_BACKENDS = ("fake",)  # no sockets: health checks use it, nothing to map


class NoDisaggregationCode(Undecided, SourceError):
    """The tree has no sglang disaggregation package (or no backend directory with a conn.py).

    Nothing was there to check, so nothing can be called clean: INCONCLUSIVE (exit 3). Still a
    :class:`~forensics.sglang_source.SourceError` for callers that catch that.
    """


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

    @property
    def understood(self) -> bool:
        """Whether every receiver loop of this backend was read and interpreted."""
        return all(loop.understood for loop in self.loops)

    def handles_abort(self) -> bool | None:
        """Whether every prefill loop handles an ABORT frame (sent or not); None without a prefill
        loop, and None when a prefill loop was not understood (unless it dies on ABORT anyway)."""
        if not self.abort_probe:
            return None
        outcomes = self.abort_probe.values()
        if any(o.kills for o in outcomes):
            return False
        prefill = self.loops_for(PREFILL)
        if not all(loop.understood for loop in prefill):
            return None
        return all(o.fate == "handled" for o in outcomes)

    def to_dict(self, with_source: bool = False) -> dict:
        return {
            "backend": self.backend,
            "manager": self.classes.manager,
            "sender_class": self.classes.sender,
            "receiver_class": self.classes.receiver,
            "inherits": self.inherits,
            "bootstrap_timeout": self.bootstrap_timeout,
            "handles_abort": self.handles_abort(),
            "understood": self.understood,
            "loops": [loop.to_dict(with_source) for loop in self.loops],
            "sent": [m.to_dict() for m in self.sent],
            "deliveries": [d.to_dict() for d in self.deliveries],
        }


@dataclass
class HandlerMap:
    """Everything the analysis found in one release (or fork).

    ``unreadable`` lists, with file and line, every part it could not read or interpret;
    :attr:`verdict` is the CI gate's word: "findings", "inconclusive" or "clean".
    """

    version: str
    origin: str
    root: str
    backends: dict[str, BackendMap]
    gaps: list[Gap]
    _index: SourceIndex | None = field(default=None, repr=False)
    unreadable: list[Unreadable] = field(default_factory=list)

    def backend(self, name: str) -> BackendMap:
        """The mapped backend ``name``. Raises :class:`UnreadableBackend` (a KeyError that is also
        INCONCLUSIVE) when its code is there but could not be read, a plain KeyError when the tree
        has no such backend."""
        if name not in self.backends:
            blind = [u for u in self.unreadable if u.backend == name]
            if blind:
                raise UnreadableBackend(
                    f"sglang {self.version}: the {name} backend could not be read: {describe_unreadable(blind)}",
                    blind,
                )
            raise KeyError(
                f"sglang {self.version} has no mapped backend {name!r} (mapped: {', '.join(self.backends) or 'none'})"
            )
        return self.backends[name]

    def unreadable_for(self, backend: str) -> list[Unreadable]:
        """What could not be read or understood for ``backend``, shared files included."""
        return [u for u in self.unreadable if u.backend in (backend, None)]

    @property
    def findings(self) -> list:
        from forensics.handlers.findings import findings_of

        return findings_of(self)

    @property
    def loops_found(self) -> int:
        return sum(len(b.loops) for b in self.backends.values())

    def verdict_for(self, findings: list) -> str:
        """The verdict word given these findings (a diff passes its own subset)."""
        if any(f.certain for f in findings):
            return FINDINGS
        if self.unreadable or self.loops_found == 0 or findings:
            return INCONCLUSIVE
        return CLEAN

    @property
    def verdict(self) -> str:
        """"findings" when a finding on a loop that was understood stands (exit 1), else
        "inconclusive" when anything could not be read or understood, or no receiver loop was
        found at all (exit 3), else "clean" (exit 0). Unreadable parts are listed either way."""
        return self.verdict_for(self.findings)

    @property
    def exit_status(self) -> ExitStatus:
        return VERDICT_STATUS[self.verdict]

    def reasons(self) -> list[str]:
        """Why the verdict is what it is, one sentence each (what was missing, when inconclusive)."""
        findings = self.findings
        certain = [f for f in findings if f.certain]
        reasons = []
        if certain:
            reasons.append(f"{len(certain)} finding(s) on receiver loops that were read and understood")
        guessed = [f for f in findings if not f.certain]
        if guessed:
            reasons.append(f"{len(guessed)} finding(s) on loops that were not fully understood (not decisive)")
        for entry in self.unreadable:
            reasons.append(f"not read or not understood: {entry}")
        if self.loops_found == 0 and not self.unreadable:
            reasons.append("no receiver loop was found in any backend: nothing was checked")
        if not reasons:
            loops = self.loops_found
            reasons.append(f"{loops} receiver loop(s) in {len(self.backends)} backend(s) read and understood; "
                           "every sent tag handled and no loop dies on a foreign frame")
        return reasons

    def undecided(self) -> UnreadableSource | None:
        """The INCONCLUSIVE exception for this map (message naming file and line), or None when decided."""
        if self.verdict != INCONCLUSIVE:
            return None
        if self.unreadable:
            return UnreadableSource(
                f"sglang {self.version} at {self.root}: {len(self.unreadable)} part(s) could not be read or "
                f"understood: {describe_unreadable(self.unreadable, limit=10)}", self.unreadable)
        return UnreadableSource(f"sglang {self.version} at {self.root}: no receiver loop was found in any backend")

    def to_dict(self, with_source: bool = False) -> dict:
        findings = self.findings
        return {
            "version": self.version,
            "origin": self.origin,
            "root": self.root,
            "verdict": self.verdict_for(findings),
            "reasons": self.reasons(),
            "backends": {name: b.to_dict(with_source) for name, b in self.backends.items()},
            "findings": [f.to_dict() for f in findings],
            "unreadable": [u.to_dict() for u in self.unreadable],
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
                        "understood": delivery.loop.understood if delivery.loop else False,
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
    """Map every backend's receiver loops and senders in ``source``.

    Raises :class:`NoDisaggregationCode` (INCONCLUSIVE) for a tree without disaggregation
    code. Everything else the analysis could not read or interpret is kept on the map as
    :attr:`HandlerMap.unreadable`, with its file and line, and the rest of the map stands.
    """
    disaggregation = source.disaggregation
    if not disaggregation.is_dir():
        raise NoDisaggregationCode(
            f"{source.root}: no {disaggregation.relative_to(source.root)} directory "
            "(looked for sglang/srt/disaggregation/<backend>/conn.py): nothing to check",
            path=str(source.root),
        )
    backends = [b for b in source.backends() if b not in SKIPPED_BACKENDS]
    if not backends:
        raise NoDisaggregationCode(
            f"{disaggregation}: no backend directory with a conn.py (looked for nixl/, mooncake/, mori/, ...): "
            "nothing to check",
            path=str(disaggregation),
        )
    index = SourceIndex.load(disaggregation, backends)
    gaps: list[Gap] = list(index.gaps)
    unreadable: list[Unreadable] = list(index.unreadable)
    found_loops = find_loops(index, gaps)
    sites = find_send_sites(index)
    mapped: dict[str, BackendMap] = {}
    for backend in backends:
        relpath = f"{backend}/conn.py"
        path = str(disaggregation / relpath)
        if relpath not in index.files:
            continue  # its parse error is already a gap and an unreadable entry
        classes = backend_classes(index, backend)
        if classes.manager is None:
            gaps.append(Gap(relpath, "a *KVManager class", "none defined; backend skipped"))
            unreadable.append(Unreadable(relpath, None, backend,
                                         "no *KVManager class defined: its receiver loops cannot be found", NO_MANAGER,
                                         path))
            continue
        manager_line = index.lookup_class(classes.manager, index.files[relpath]).node.lineno
        loops: list[ReceiverLoop] = []
        codes: dict[str, LoopCode] = {}
        opaque: dict[str, list[Opaque]] = {}
        for found, inherited in loops_for_backend(index, backend, classes, found_loops):
            try:
                loop, code = evaluate_loop(index, found, backend, classes, inherited)
            except Exception as exc:  # noqa: BLE001 - a loop the analysis breaks on is reported, not a crash
                function = found.code.function
                unreadable.append(Unreadable(
                    found.code.parsed.relpath, function.lineno, backend,
                    f"the analysis failed on the receiver loop {function.name}: {type(exc).__name__}: {exc}",
                    ANALYSIS_ERROR, str(disaggregation / found.code.parsed.relpath)))
                continue
            loops.append(loop)
            codes[loop.function] = code
            opaque[loop.function] = []
        if not loops:
            gaps.append(
                Gap(relpath, "a thread whose target loops over a ZMQ recv_multipart()",
                    f"{classes.manager} starts no receiver loop (own or inherited)")
            )
            if not any(u.backend == backend and u.kind == ANALYSIS_ERROR for u in unreadable):
                unreadable.append(Unreadable(
                    relpath, manager_line, backend,
                    f"{classes.manager} starts no receiver loop the analysis recognises (a threading.Thread whose "
                    "target loops over recv_multipart()): what it does with any frame is unknown", NO_LOOP, path))
            continue
        sent = senders_for_backend(index, backend, classes, sites, found_loops, gaps)
        deliveries: list[Delivery] = []
        no_reader: dict[str, SentMessage] = {}
        for message in sent:
            receivers = [loop for loop in loops if loop.role == message.receiver_role]
            if not receivers:
                no_reader.setdefault(message.receiver_role, message)
                deliveries.append(
                    Delivery(message, None, Outcome(UNREAD, f"{backend} runs no {message.receiver_role} receiver loop",
                                                    message.file, message.line))
                )
            for loop in receivers:
                outcome = _worst(run_frame(index, codes[loop.function], message.shape, opaque[loop.function]),
                                 run_frame(index, codes[loop.function], message.shape.full(), opaque[loop.function]))
                deliveries.append(Delivery(message, loop, outcome))
        abort_probe = {
            loop.function: run_frame(index, codes[loop.function], ABORT_PROBE, opaque[loop.function])
            for loop in loops if loop.role == PREFILL
        }
        for loop in loops:
            _add_not_understood(loop, not_understood(index, opaque[loop.function], backend))
            unreadable.extend(loop.not_understood)
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
        if not any(loop.role == PREFILL for loop in loops):
            unreadable.append(Unreadable(
                relpath, manager_line, backend,
                f"{classes.manager} starts no prefill receiver loop the analysis recognises (the bootstrap thread): "
                "what the prefill does with the decode's frames is unknown", NO_LOOP, path))
        for role, message in no_reader.items():
            if role == PREFILL:
                continue  # said just above
            unreadable.append(Unreadable(
                message.file, message.line, backend,
                f"{message.function} sends {message.tag} to the {role}, and no {role} receiver loop of {backend} "
                "was found to read it", NO_READER, str(disaggregation / message.file)))
    return HandlerMap(source.version, source.origin, str(source.root), mapped, gaps, index,
                      unreadable=_unique(unreadable))


def _add_not_understood(loop: ReceiverLoop, entries: list[Unreadable]) -> None:
    for entry in entries:
        if not any((u.file, u.line, u.reason) == (entry.file, entry.line, entry.reason) for u in loop.not_understood):
            loop.not_understood.append(entry)


def _unique(entries: list[Unreadable]) -> list[Unreadable]:
    return list(dict.fromkeys(entries))


_SEVERITY = {"thread dies": 4, "dropped, exception logged": 3, "dropped with warning": 2, "dropped silently": 1}


def _worst(first: Outcome, second: Outcome) -> Outcome:
    return first if _SEVERITY.get(first.fate, 0) >= _SEVERITY.get(second.fate, 0) else second
