"""``check_dump_files``: dumps from files and logs against the threads a release should run.

Each dump (:mod:`forensics.threads.textdump`) covers one process. It is checked only when it is
the role's scheduler, which the dump itself must show: py-spy's title (``sglang::scheduler``,
``sglang::detokenizer``, ``... -m sglang.launch_server``), else its stacks
(``run_scheduler_process``, the detokenizer's or the HTTP server's entry points), and the role
from the scheduler's event loop (``event_loop_*_disagg_prefill`` or ``..._decode``). A dump of
another process, or of the other role's scheduler, is listed with why it was not checked.

A thread is found by its name where the format names threads (py-spy), else by the function its
stack was started on, in the file the release's source starts it from (faulthandler). Per dump
and expected thread the status is ``ok``, ``missing``, ``unexpected_count``, or ``inconclusive``
when fewer were found than expected in a dump that is cut or damaged (the thread may be in what
was lost). The whole check exits 1 when a checked dump lacks an expected thread, 0 when every
file was read and every scheduler dump of the role has every expected thread, and 3 otherwise,
with the reasons.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from forensics.exitcodes import EnvironmentProblem, ExitStatus
from forensics.threads.check import INCONCLUSIVE, MISSING, OK, UNEXPECTED_COUNT
from forensics.threads.expected import ExpectedThread, ExpectedThreads
from forensics.threads.textdump import DumpFileError, ReadDump, read_dump_file, thread_target

SCHEDULER = "scheduler"
HTTP_SERVER = "http server"
DETOKENIZER = "detokenizer"
UNKNOWN = "unknown"

CLEAN = "clean"
FINDINGS = "findings"
NOT_CHECKED = "not checked"

FILE_CHECK_COLUMNS = ("source", "line", "format", "pid", "process", "role", "logical_name", "thread_name",
                      "expected", "found", "status", "threads", "source_line")

# Stack markers, as (process, file suffix or function); the first that any frame shows wins.
_PROCESS_MARKERS = (
    (SCHEDULER, "function", "run_scheduler_process"),
    (SCHEDULER, "file", "managers/scheduler.py"),
    (DETOKENIZER, "function", "run_detokenizer_process"),
    (DETOKENIZER, "file", "detokenizer_manager.py"),
    (HTTP_SERVER, "file", "sglang/launch_server.py"),  # py-spy shortens paths to the package's
    (HTTP_SERVER, "file", "http_server.py"),
    (HTTP_SERVER, "file", "uvicorn/server.py"),
)


@dataclass
class Identity:
    """Which process a dump shows, and how that was told."""

    process: str  # SCHEDULER, HTTP_SERVER, DETOKENIZER or UNKNOWN
    role: str | None  # "prefill", "decode", or None when the dump does not show it
    why: str


def identify(dump: ReadDump) -> Identity:
    """The process and role a dump shows: its title first, then its stacks."""
    frames = [f for text in dump.frame["frames"] for f in str(text).split("\n") if f]
    role, role_why = _role(frames)
    title = (dump.title or "").strip()
    if title:
        shown = title.split()[0] if title.startswith("sglang::") else title
        if title.startswith("sglang::scheduler"):
            return Identity(SCHEDULER, role, f"py-spy's title {shown!r}" + role_why)
        if title.startswith("sglang::detokenizer"):
            return Identity(DETOKENIZER, role, f"py-spy's title {shown!r}")
        if "sglang.launch_server" in title or "sglang/launch_server" in title:
            return Identity(HTTP_SERVER, role, "its py-spy title, sglang.launch_server's command line")
    for process, kind, marker in _PROCESS_MARKERS:
        for frame in frames:
            function, _, where = frame.partition(" (")
            file = where.rstrip(")").rsplit(":", 1)[0]
            if (kind == "function" and function.rsplit(".", 1)[-1] == marker) or (kind == "file"
                                                                                   and file.endswith(marker)):
                return Identity(process, role, f"its stacks ({marker})" + (role_why if process == SCHEDULER else ""))
    return Identity(UNKNOWN, role, "neither a title nor a stack of sglang's processes"
                    + (f" (title {title!r})" if title else ""))


def _role(frames: list[str]) -> tuple[str | None, str]:
    for frame in frames:
        function = frame.partition(" (")[0]
        if "disagg_prefill" in function:
            return "prefill", f", {function.rsplit('.', 1)[-1]} in its stacks"
        if "disagg_decode" in function:
            return "decode", f", {function.rsplit('.', 1)[-1]} in its stacks"
    return None, ""


@dataclass
class DumpResult:
    """One dump: what it is, and (for the role's scheduler) its threads against the release's."""

    dump: ReadDump
    identity: Identity
    status: str  # CLEAN, FINDINGS, INCONCLUSIVE, NOT_CHECKED
    rows: list[dict] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why it is inconclusive or not checked

    def line(self) -> str:
        """Where the dump is, then what it is, on its own line (two short lines read at 80 columns)."""
        d = self.dump
        who = f"pid {d.pid}" if d.pid is not None else "pid not shown"
        when = f", logged after {d.logged_at:%Y-%m-%d %H:%M:%S}" if d.logged_at else ""
        what = self.identity.process + (f" ({self.identity.role})" if self.identity.role else "")
        return f"{d.where}\n  {d.format}, {what}, {who}, {d.thread_count()} threads{when}: {self.status}"


@dataclass
class DumpFileCheck:
    """Every dump of the given files, checked against ``release``'s threads for ``role``."""

    release: str
    backend: str
    role: str
    files: list[str]
    results: list[DumpResult]
    problems: list[str]  # files that could not be read, or hold no dump

    @property
    def checked(self) -> list[DumpResult]:
        return [r for r in self.results if r.status != NOT_CHECKED]

    @property
    def status(self) -> str:
        if any(r.status == FINDINGS for r in self.results):
            return FINDINGS
        if self.checked and not self.problems and all(r.status == CLEAN for r in self.checked):
            return CLEAN
        return INCONCLUSIVE

    @property
    def exit_status(self) -> ExitStatus:
        return {FINDINGS: ExitStatus.BAD, CLEAN: ExitStatus.GOOD}.get(self.status, ExitStatus.INCONCLUSIVE)

    def reasons(self) -> list[str]:
        """Why the check is inconclusive (empty when it is not)."""
        if self.status != INCONCLUSIVE:
            return []
        out = list(self.problems)
        for result in self.results:
            out += [f"{result.dump.where}: {reason}" for reason in result.reasons]
        if not self.checked:
            out.append(f"no dump of a {self.role} scheduler among {len(self.results)} dump(s): the threads sglang's "
                       f"KV manager runs live in the scheduler process (py-spy dump --pid the process titled "
                       "sglang::scheduler)")
        return out

    def frame(self) -> pd.DataFrame:
        return rows_frame([row for result in self.results for row in result.rows], FILE_CHECK_COLUMNS)

    def to_frame(self) -> pd.DataFrame:
        return self.frame()

    def text(self) -> str:
        head = f"{self.status.upper()}: {self.role} threads against sglang {self.release} {self.backend}"
        lines = [head]
        for result in self.results:
            lines.append(f"- {result.line()}")
            lines += [f"    {x}" for x in result.findings + result.reasons]
        lines += [f"- {p}" for p in self.problems]
        if not self.checked:
            lines.append(f"- {self.reasons()[-1]}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return (f"<DumpFileCheck {self.status}: {self.role} vs sglang {self.release} {self.backend}, "
                f"{len(self.checked)} of {len(self.results)} dump(s) checked>")

    def _repr_html_(self) -> str:
        colour = {CLEAN: "#2e7d32", FINDINGS: "#c62828"}.get(self.status, "#ef6c00")
        items = "".join(f"<li>{html.escape(r.line()).replace(chr(10), '<br>')}"
                        + "".join(f"<br>&nbsp;&nbsp;{html.escape(x)}" for x in r.findings + r.reasons) + "</li>"
                        for r in self.results)
        items += "".join(f"<li>{html.escape(p)}</li>" for p in self.problems)
        return (f"<p><b style='color:{colour}'>{self.status}</b>: {html.escape(self.role)} threads against sglang "
                f"{html.escape(self.release)} {html.escape(self.backend)}</p><ul>{items}</ul>"
                + self.frame()._repr_html_())

    def to_dict(self) -> dict:
        from forensics.jsonable import frame_json

        return {
            "release": self.release, "backend": self.backend, "role": self.role, "files": self.files,
            "dumps": [{"source": r.dump.source, "line": r.dump.line, "format": r.dump.format, "pid": r.dump.pid,
                       "title": r.dump.title, "process": r.identity.process, "role": r.identity.role,
                       "identified_by": r.identity.why, "threads": r.dump.thread_count(), "status": r.status,
                       "logged_at": r.dump.logged_at.isoformat() if r.dump.logged_at else None,
                       "context": r.dump.context, "truncated": r.dump.truncated, "problems": r.dump.problems,
                       "findings": r.findings, "reasons": r.reasons} for r in self.results],
            "problems": self.problems,
            "reasons": self.reasons(),
            "rows": frame_json(self.frame()),
        }


def rows_frame(rows: list[dict], columns) -> pd.DataFrame:
    """``DumpResult.rows`` (with any more keys ``columns`` names) as a frame: line, pid and found as
    exact integers, a missing pid (faulthandler's) as NA."""
    frame = pd.DataFrame(rows, columns=list(columns))
    for column in ("line", "pid", "found"):
        frame[column] = pd.array([r[column] for r in rows], dtype="Int64")
    return frame


def check_dump(dump: ReadDump, expected: ExpectedThreads, role: str) -> DumpResult:
    """One dump against the release's threads for ``role`` (NOT_CHECKED when it is another process)."""
    identity = identify(dump)
    if identity.process == UNKNOWN:
        identity = _by_kv_threads(_Threads(dump), expected) or identity
    if identity.process != SCHEDULER:
        return DumpResult(dump, identity, NOT_CHECKED,
                          reasons=[f"a dump of sglang's {identity.process} process, not of a scheduler "
                                   f"(told by {identity.why}): the KV manager's threads run in the scheduler"
                                   if identity.process != UNKNOWN else
                                   f"not recognisably an sglang process ({identity.why})"])
    if identity.role is not None and identity.role != role:
        return DumpResult(dump, identity, NOT_CHECKED,
                          reasons=[f"a {identity.role} scheduler's dump (told by {identity.why}), not a {role}'s"])
    result = DumpResult(dump, identity, CLEAN)
    if identity.role is None:
        result.reasons.append(f"its stacks do not show the role: checked as a {role} scheduler, as asked")
    threads = _Threads(dump)
    for row in expected.for_role(role):
        matched = threads.matching(row)
        found = len(matched)
        enough = found >= row.min_count
        if enough and (row.max_count is None or found <= row.max_count):
            status = OK
        elif not enough and not dump.complete:
            status = INCONCLUSIVE
        else:
            status = MISSING if found == 0 else UNEXPECTED_COUNT
        subject = row.target if row.thread_name.startswith("Thread-N (") else row.thread_name
        if status in (MISSING, UNEXPECTED_COUNT):
            what = "missing" if found == 0 else "has an unexpected count"
            result.findings.append(f"{subject} {what} (expected {row.expected_text()}, found {found}; started at "
                                   f"{row.source})")
        elif status == INCONCLUSIVE:
            lost = "; ".join(dump.truncated + dump.problems[:3])
            result.reasons.append(f"{subject}: {found} found, {row.expected_text()} expected, and the dump is not "
                                  f"whole ({lost}): the rest may be in what was lost")
        result.rows.append({
            "source": dump.source, "line": dump.line, "format": dump.format, "pid": dump.pid,
            "process": identity.process, "role": role, "logical_name": row.logical_name,
            "thread_name": row.thread_name, "expected": row.expected_text(), "found": found, "status": status,
            "threads": ", ".join(matched), "source_line": row.source,
        })
    statuses = {r["status"] for r in result.rows}
    if statuses & {MISSING, UNEXPECTED_COUNT}:
        result.status = FINDINGS
    elif INCONCLUSIVE in statuses:
        result.status = INCONCLUSIVE
    return result


class _Threads:
    """A dump's threads as the check reads them: by name where the format names them, else by the
    function each was started on (faulthandler)."""

    def __init__(self, dump: ReadDump) -> None:
        self.named = dump.named
        self.names = [str(n) for n in dump.frame["thread_name"]]
        self.targets = [t for t in map(thread_target, (str(f) for f in dump.frame["frames"])) if t is not None]

    def matching(self, row: ExpectedThread) -> list[str]:
        """The threads that are ``row``'s: their names, or "thread on TARGET" for each unnamed one."""
        if self.named:
            return [n for n in self.names if row.matches(n)]
        return [f"thread on {t[0]}" for t in self.targets if _started_on(t, row)]


def _by_kv_threads(threads: _Threads, expected: ExpectedThreads) -> Identity | None:
    """A scheduler known by the KV manager's own threads, when its main thread is not in the dump
    (faulthandler lists the newest 100 threads; the main thread is the oldest)."""
    roles = {(row.role, row.target) for row in expected.rows if threads.matching(row)}
    if len({role for role, _ in roles}) != 1:
        return None
    role = next(iter(roles))[0]
    shown = ", ".join(sorted({target for _, target in roles}))
    return Identity(SCHEDULER, role, f"its threads started on the {role} KV manager's {shown}")


def _started_on(target: tuple[str, str], row: ExpectedThread) -> bool:
    """A faulthandler thread started on ``row``'s target: the function, in the file the source says."""
    function, file = target
    wanted_file = (row.target_source or row.source).rsplit(":", 1)[0]
    return function == row.target and file.replace("\\", "/").endswith(wanted_file)


def check_dump_files(paths, *, sglang: str, role: str, backend: str = "nixl",
                     expected: ExpectedThreads | None = None) -> DumpFileCheck:
    """Read every dump in ``paths`` and check the ``role`` scheduler's against ``sglang``'s threads.

        from forensics.threads import check_dump_files
        check = check_dump_files(["prefill.log", "dump.txt"], sglang="0.5.15", role="prefill")
        check.status, check.exit_status, check.frame()

    A file that cannot be read is a problem of the check (named), never the loss of the others;
    when no file can be read at all, :class:`~forensics.exitcodes.EnvironmentProblem` (exit 4).
    """
    from forensics.threads.expected import expected_threads

    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be prefill or decode, not {role!r}")
    if expected is None:
        expected = expected_threads(sglang, backend)
    files = [str(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    results: list[DumpResult] = []
    problems: list[str] = []
    unreadable: list[str] = []
    for path in files:
        try:
            dumps = read_dump_file(path)
        except DumpFileError as exc:
            problems.append(str(exc))
            if exc.unreadable:
                unreadable.append(str(exc))
            continue
        if not dumps:
            problems.append(f"{path}: no thread dump in it (py-spy's text or JSON, or a faulthandler dump)")
        results += [check_dump(dump, expected, role) for dump in dumps]
    if files and len(unreadable) == len(files):
        raise EnvironmentProblem("no dump file could be read: " + "; ".join(unreadable))
    return DumpFileCheck(expected.release, backend, role, files, results, problems)
