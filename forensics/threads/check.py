"""``check_threads``: the threads a release's KV manager should run, against a dump.

Per expected thread (:mod:`forensics.threads.expected`) and dumped pid: how many of the
dump's threads carry its name (``Thread-N (bootstrap_thread)`` or its given name), and a
status:

* ``ok``: the count is within [min_count, max_count];
* ``missing``: none found where at least one was expected;
* ``unexpected_count``: some found, but fewer or more than expected;
* ``inconclusive``: the pid could not be dumped (its Gap says why and what to do).

Threads named *like* an expected one but not as sglang names it (``transfer_worker_0``
for ``Thread-N (transfer_worker)``) are listed in ``similar``, never counted: the check
reports what sglang's code would show, not a guess. Threads the table does not mention
(MainThread, the watchdog, NIXL's own) are not findings.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from forensics.evidence import Gap
from forensics.threads.dump import ThreadDump
from forensics.threads.expected import ExpectedThread, ExpectedThreads

OK = "ok"
MISSING = "missing"
UNEXPECTED_COUNT = "unexpected_count"
INCONCLUSIVE = "inconclusive"
STATUSES = (OK, MISSING, UNEXPECTED_COUNT, INCONCLUSIVE)

CHECK_COLUMNS = (
    "role", "pid", "logical_name", "target", "thread_name", "expected", "min_count", "max_count", "found",
    "status", "threads", "similar", "daemon", "started", "condition", "source",
)


@dataclass
class ThreadCheck:
    """Per expected thread and pid: found count and status; ``findings`` in words."""

    role: str
    release: str
    backend: str
    frame: pd.DataFrame
    findings: list[str]
    gaps: list[Gap] = field(default_factory=list)

    @property
    def inconclusive(self) -> bool:
        return bool(self.gaps)

    @property
    def ok(self) -> bool:
        """Every expected thread was found in the expected number, on every pid that was dumped,
        and every pid was dumped (an undumped pid is never "ok")."""
        return not self.gaps and bool((self.frame["status"] == OK).all())

    @property
    def status(self) -> str:
        if (self.frame["status"].isin([MISSING, UNEXPECTED_COUNT])).any():
            return "findings"
        return INCONCLUSIVE if self.gaps else "clean"

    def to_frame(self) -> pd.DataFrame:
        return self.frame

    def __str__(self) -> str:
        head = f"{self.role} threads, sglang {self.release} {self.backend}: {self.status}"
        return "\n".join([head, *(f"  - {f}" for f in self.findings)])

    def _repr_html_(self) -> str:
        colour = {"clean": "#2e7d32", "findings": "#c62828"}.get(self.status, "#ef6c00")
        items = "".join(f"<li>{html.escape(f)}</li>" for f in self.findings)
        return (f"<p><b style='color:{colour}'>{self.status}</b>: {html.escape(self.role)} threads against "
                f"sglang {html.escape(self.release)} {html.escape(self.backend)}</p>"
                + (f"<ul>{items}</ul>" if items else "") + self.frame._repr_html_())

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        style = {"clean": "green", "findings": "red"}.get(self.status, "yellow")
        table = Table(title=f"{self.role} threads vs sglang {self.release} {self.backend}")
        for column in ("pid", "logical_name", "thread_name", "expected", "found", "status", "source"):
            table.add_column(column)
        for row in self.frame.itertuples(index=False):
            table.add_row(str(row.pid), row.logical_name, row.thread_name, row.expected, str(row.found),
                          row.status, row.source)
        return Group(Text(self.status, style=f"bold {style}"), table, *(Text(f"- {f}") for f in self.findings))


def _similar(names: list[str], expected: ExpectedThread, matched: set[str]) -> list[str]:
    key = expected.target.strip("_").lower()
    return sorted(n for n in names if n not in matched and key in n.lower())


def _finding(row: ExpectedThread, role: str, pid: int, found: int, similar: list[str]) -> str:
    what = "missing" if found == 0 else "has an unexpected count"
    subject = row.target if row.thread_name.startswith("Thread-N (") else row.thread_name
    text = (f"{subject} {what} on "
            f"{role} pid {pid} (expected {row.expected_text()}, found {found}; target {row.target} in "
            f"{row.source})")
    if similar:
        text += (f"; {len(similar)} thread(s) named like it but not as sglang {row.release} names it: "
                 + ", ".join(similar[:8]))
    return text


def check_threads(
    dump: ThreadDump,
    expected: ExpectedThreads,
    *,
    role: str,
    pid: int | None = None,
) -> ThreadCheck:
    """Check the ``role`` scheduler process(es) in ``dump`` against ``expected``.

    ``pid`` picks one process of the dump (default: every pid the dump was asked for).
    A pid the dump could not read makes its rows ``inconclusive`` and the check's status
    INCONCLUSIVE, with the Gap's reason and fix in the findings.
    """
    pids = [pid] if pid is not None else list(dump.pids)
    if pid is not None and pid not in dump.pids:
        raise ValueError(f"pid {pid} is not in this dump (pids: {dump.pids})")
    rows_expected = expected.for_role(role)
    records: list[dict] = []
    findings: list[str] = []
    gaps: list[Gap] = []
    for current in pids:
        gap = dump.gap(current)
        if gap is not None:
            gaps.append(gap)
            findings.append(f"INCONCLUSIVE: threads of {role} pid {current} could not be read: {gap.reason}"
                            + (f" (fix: {gap.fix})" if gap.fix else ""))
        names = [] if gap is not None else [str(n) for n in dump.threads(current)["thread_name"]]
        for row in rows_expected:
            matched = [n for n in names if row.matches(n)]
            similar = _similar(names, row, set(matched))
            found = len(matched)
            if gap is not None:
                status = INCONCLUSIVE
            elif row.min_count <= found and (row.max_count is None or found <= row.max_count):
                status = OK
            elif found == 0:
                status = MISSING
            else:
                status = UNEXPECTED_COUNT
            if status in (MISSING, UNEXPECTED_COUNT):
                findings.append(_finding(row, role, current, found, similar))
            records.append({
                "role": role,
                "pid": current,
                "logical_name": row.logical_name,
                "target": row.target,
                "thread_name": row.thread_name,
                "expected": row.expected_text(),
                "min_count": row.min_count,
                "max_count": row.max_count,
                "found": None if gap is not None else found,
                "status": status,
                "threads": ", ".join(sorted(matched)),
                "similar": ", ".join(similar),
                "daemon": row.daemon,
                "started": row.started,
                "condition": row.condition,
                "source": row.source,
            })
    frame = pd.DataFrame(records, columns=list(CHECK_COLUMNS))
    frame["pid"] = pd.array([r["pid"] for r in records], dtype="int64")
    for column in ("min_count", "max_count", "found"):
        frame[column] = pd.array([r[column] for r in records], dtype="Int64")
    frame["daemon"] = pd.array([r["daemon"] for r in records], dtype="boolean")
    return ThreadCheck(role, expected.release, expected.backend, frame, findings, gaps)
