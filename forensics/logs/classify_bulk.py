"""Classify many messages at once, with exactly the answers of ``catalogue.classify``.

``catalogue.classify(message)`` walks every event signature in order, testing its
literal and then its regex. During an abort storm tens of thousands of lines take that
walk. Here the same decision is made for a whole list of messages together:

* every literal is looked for once in the messages joined by newlines (one C
  ``str.find`` pass per literal; a message holds no newline), which gives each
  message its candidate signatures, already in catalogue order;
* a message then runs only its candidates' regexes, and signatures that share a
  pattern (``decode_transfer_aborted`` / ``_timeout`` / ``_failed`` differ only in
  their ``reason``) share one ``search``.

The catalogue is read through its public functions only (``event_signatures``), so a
signature added to ``signatures.toml`` is picked up without a change here.
``tests/test_logs_event_path.py`` checks the answers against ``catalogue.classify``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from forensics.logs import catalogue

Match = tuple[catalogue.Signature, dict]


class BulkClassifier:
    """``classify(messages)`` -> for each message, ``catalogue.classify(message)``."""

    def __init__(self, signatures: Sequence[catalogue.Signature] | None = None) -> None:
        self.signatures = tuple(catalogue.event_signatures() if signatures is None else signatures)
        # Literal -> the indices (in catalogue order) of the signatures that use it.
        self.by_literal: dict[str, list[int]] = {}
        for index, signature in enumerate(self.signatures):
            self.by_literal.setdefault(signature.literal, []).append(index)
        # Per signature: (literal, pattern slot, compiled regex, reason regex or None).
        slots: dict[str, int] = {}
        self.entries = []
        for signature in self.signatures:
            slot = slots.setdefault(signature.pattern, len(slots))
            self.entries.append((signature, slot, signature.regex, signature.reason_regex))
        self.slots = len(slots)

    def candidates(self, messages: Sequence[str]) -> list[list[int] | None]:
        """For each message, the indices of the signatures whose literal it holds (None: none)."""
        joined = "\n".join(messages)
        starts = []
        position = 0
        for message in messages:
            starts.append(position)
            position += len(message) + 1
        found: list[list[int] | None] = [None] * len(messages)
        find = joined.find
        for literal, indices in self.by_literal.items():
            if not literal:
                # An empty literal is in every message (as ``"" in message`` is).
                for row in range(len(messages)):
                    found[row] = (found[row] or []) + indices
                continue
            position = find(literal)
            while position >= 0:
                row = bisect_right(starts, position) - 1
                end = starts[row] + len(messages[row])
                if position + len(literal) <= end:  # inside this message, not across the newline
                    current = found[row]
                    found[row] = indices if current is None else current + indices
                    position = find(literal, end)  # one hit per message is enough
                else:
                    position = find(literal, position + 1)
        # Candidates must be tried in catalogue order.
        for row, indices in enumerate(found):
            if indices is not None and len(indices) > 1:
                found[row] = sorted(set(indices))
        return found

    def candidates_from(self, messages: Sequence[str], held: Sequence) -> list[list[int] | None]:
        """Candidates when each message's line is known to hold ``held[i]`` (literals, as str).

        ``held`` may name literals that sit outside the message (in a journal prefix) and
        must name every literal inside it; each is checked against the message itself.
        """
        by_literal = self.by_literal
        everywhere = by_literal.get("", [])
        found: list[list[int] | None] = []
        for message, literals in zip(messages, held):
            indices = list(everywhere)
            for literal in literals:
                more = by_literal.get(literal)
                if more and literal in message:
                    indices += more
            if not indices:
                found.append(None)
            else:
                found.append(sorted(set(indices)) if len(indices) > 1 else indices)
        return found

    def classify(self, messages: Sequence[str], held: Sequence | None = None) -> list[Match | None]:
        """``[catalogue.classify(m) for m in messages]``, in bulk.

        ``held``: for each message, the literals its line was found to hold (see
        ``candidates_from``); without it the literals are looked for here.
        """
        results: list[Match | None] = []
        append = results.append
        entries = self.entries
        candidates = self.candidates(messages) if held is None else self.candidates_from(messages, held)
        for message, indices in zip(messages, candidates):
            if indices is None:
                append(None)
                continue
            answer = None
            searched: dict[int, dict | None] = {}  # pattern slot -> its captured fields (None: no match)
            for index in indices:
                signature, slot, regex, reason_regex = entries[index]
                if slot in searched:
                    fields = searched[slot]
                else:
                    found = regex.search(message)
                    fields = searched[slot] = found.groupdict() if found is not None else None
                if fields is None:
                    continue
                if reason_regex is not None and not reason_regex.search(fields.get("reason") or ""):
                    continue
                answer = (signature, fields)
                break
            append(answer)
        return results


_cached: tuple[tuple, BulkClassifier] | None = None


def classifier() -> BulkClassifier:
    """The classifier of the current catalogue (rebuilt when the catalogue is reloaded)."""
    global _cached
    signatures = catalogue.event_signatures()
    if _cached is None or _cached[0] is not signatures:
        _cached = (signatures, BulkClassifier(signatures))
    return _cached[1]


def classify_many(messages: Sequence[str], held: Sequence | None = None) -> list[Match | None]:
    """``[catalogue.classify(m) for m in messages]``, in bulk (``held``: see ``BulkClassifier.classify``)."""
    return classifier().classify(messages, held)
