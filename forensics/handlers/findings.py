"""Findings: sent tags a receiver loop does not handle, and loops that die on foreign frames.

Derived only from the map (the code), never from a version table: a tag is a finding in a
release exactly when some sender in that release builds it and the receiving loop of the
same backend does not take it. Rated by what happens: the thread dies (critical) or the
frame is dropped (warning). A finding on a loop the analysis did not fully understand
carries a ``caveat`` naming what it could not interpret: it is listed, and does not decide
a verdict on its own.
"""

from __future__ import annotations

from forensics.handlers.model import (
    CRITICAL,
    DIES,
    DROPPED_LOGGED,
    DROPPED_SILENTLY,
    DROPPED_WARNING,
    WARNING,
    Finding,
)

UNHANDLED = "unhandled-tag"
FRAGILE = "dies-on-unknown-frame"


def _caveat(loop) -> str:
    if loop.understood:
        return ""
    first = loop.not_understood[0]
    more = f" (and {len(loop.not_understood) - 1} more)" if len(loop.not_understood) > 1 else ""
    return f"the loop was not fully understood: {first.where}: {first.reason}{more}"


def findings_of(handler_map) -> list[Finding]:
    found: list[Finding] = []
    for backend in handler_map.backends.values():
        for delivery in backend.deliveries:
            outcome, message, loop = delivery.outcome, delivery.message, delivery.loop
            if loop is None or outcome.fate not in (DIES, DROPPED_WARNING, DROPPED_LOGGED, DROPPED_SILENTLY):
                continue
            severity = CRITICAL if outcome.fate == DIES else WARNING
            via = f" via {', '.join(message.via)}" if message.via else ""
            found.append(
                Finding(
                    version=handler_map.version,
                    backend=backend.backend,
                    severity=severity,
                    kind=UNHANDLED,
                    tag=message.tag,
                    receiver_role=message.receiver_role,
                    fate=outcome.fate,
                    summary=(
                        f"{message.sender_role} sends {message.tag} {message.shape.describe()} "
                        f"({message.function}{via}); {backend.backend} {loop.role} loop "
                        f"{loop.function.split('.')[-1]} has no case for it: {outcome.fate}"
                        f"{': ' + outcome.detail if outcome.detail else ''} at {outcome.file}:{outcome.line}"
                    ),
                    sender=f"{message.file}:{message.line} {message.function}",
                    receiver=f"{loop.file}:{loop.line} {loop.function}",
                    file=outcome.file,
                    line=outcome.line,
                    conditions=list(message.conditions),
                    caveat=_caveat(loop),
                )
            )
        for loop in backend.loops:
            if loop.inherited_from is not None:
                continue  # reported once, on the backend that defines it
            worst = loop.foreign if loop.foreign.kills else loop.foreign_short
            if not worst.kills:
                continue
            found.append(
                Finding(
                    version=handler_map.version,
                    backend=backend.backend,
                    severity=CRITICAL,
                    kind=FRAGILE,
                    tag="<unknown tag>",
                    receiver_role=loop.role,
                    fate=DIES,
                    summary=(
                        f"{backend.backend} {loop.role} loop {loop.function.split('.')[-1]} dies on any frame "
                        f"no branch matches: {worst.detail} at {worst.file}:{worst.line}"
                        f" ({'no per-message try' if not loop.per_message_try else 'per-message try re-raises'}"
                        f", wrapper: {loop.wrapper})"
                    ),
                    sender="(any foreign or newer-version frame)",
                    receiver=f"{loop.file}:{loop.line} {loop.function}",
                    file=worst.file,
                    line=worst.line,
                    caveat=_caveat(loop),
                )
            )
    return found
