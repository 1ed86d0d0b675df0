"""Prove the patch in the engine sandbox: the same frame scenario against the unpatched and the patched file.

Scenario (``SCENARIO``), run on the release's real bootstrap loop over a real ZMQ socket:
create rooms 1-4 as the release's sender does (Bootstrapping), register a decode peer,
bootstrap room 1, ABORT room 2, bootstrap room 3, send a foreign frame, bootstrap room 4.
After every step the report keeps: is the bootstrap thread alive, the room states, the
thread exceptions and the log lines that step produced.

The verdict is about the patched file only: PASS (exit 0) when its thread survives every
step, room 2 is Failed and rooms 3 and 4 are WaitingForInput; FAIL (exit 1) otherwise;
INCONCLUSIVE (exit 3) when the check could not run (release not fetchable, codemod
refused, sandbox could not load the release). The unpatched run is evidence shown next
to it (for 0.5.13-0.5.15.post1: the thread dies on the ABORT and rooms 3 and 4 stay in
Bootstrapping), never part of the verdict.
"""

from __future__ import annotations

import hashlib
import html
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from forensics.exitcodes import BAD, GOOD, INCONCLUSIVE

KVPOLL_NAMES = {0: "Failed", 1: "Bootstrapping", 2: "WaitingForInput", 3: "Transferring", 4: "Success"}
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT = 0, 1, 2
FOREIGN_FRAME = [b"FOREIGN", b"pd-forensics verify"]
ROOMS = (1, 2, 3, 4)

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]


@dataclass(frozen=True)
class ScenarioStep:
    name: str
    run: Callable  # (sandbox) -> a note for the report, or None


def _send_abort(sandbox, room: int) -> str | None:
    """The release's own ABORT frame; before 0.5.13 (no sender) the 0.5.13 layout, built here."""
    from forensics.sandbox import SandboxError

    try:
        sandbox.send(sandbox.frames.abort(room=room))
        return None
    except SandboxError as exc:
        if "_send_abort_notification" not in str(exc):
            raise
    sandbox.send([b"ABORT", str(room).encode("ascii"), b"127.0.0.1", b"17000"])
    return "this release's decode never sends ABORT; sent the 0.5.13 layout [b'ABORT', room, ip, port]"


SCENARIO = (
    ScenarioStep("create rooms 1-4", lambda sb: sb.create_rooms(list(ROOMS)) and None),
    ScenarioStep("register decode peer", lambda sb: sb.send(sb.frames.registration()) and None),
    ScenarioStep("bootstrap room 1", lambda sb: sb.send(sb.frames.transfer_info(room=1)) and None),
    ScenarioStep("ABORT room 2", lambda sb: _send_abort(sb, 2)),
    ScenarioStep("bootstrap room 3", lambda sb: sb.send(sb.frames.transfer_info(room=3)) and None),
    ScenarioStep("foreign frame", lambda sb: sb.send(list(FOREIGN_FRAME)) and None),
    ScenarioStep("bootstrap room 4", lambda sb: sb.send(sb.frames.transfer_info(room=4)) and None),
)
ABORT_STEP = "ABORT room 2"


def state_name(value: int | None) -> str:
    return "absent" if value is None else KVPOLL_NAMES.get(value, str(value))


def _state_letter(value: int | None) -> str:
    return "-" if value is None else KVPOLL_NAMES.get(value, "?")[0]


@dataclass
class StepReport:
    name: str
    thread_alive: bool
    room_states: dict[int, int]
    exceptions: list[dict] = field(default_factory=list)  # raised in the loop during this step
    logs: list[dict] = field(default_factory=list)  # INFO and above, produced during this step
    note: str | None = None

    def to_dict(self) -> dict:
        return {
            "step": self.name,
            "note": self.note,
            "thread_alive": self.thread_alive,
            "room_states": {str(k): state_name(v) for k, v in sorted(self.room_states.items())},
            "exceptions": [_exception_line(e) for e in self.exceptions],
            "logs": [_log_line(r) for r in self.logs],
        }


def _exception_line(record: dict) -> str:
    kind = record.get("type") or record.get("exc_type") or "Exception"
    message = record.get("message") or record.get("exc_value") or ""
    return f"{kind}: {message}".strip()


def _log_line(record: dict) -> str:
    return f"{record.get('level') or record.get('levelname', '')} {record.get('message') or record.get('msg', '')}".strip()


@dataclass
class RunReport:
    """One file (unpatched or patched) through the whole scenario."""

    kind: Literal["unpatched", "patched"]
    steps: list[StepReport] = field(default_factory=list)
    error: str | None = None  # the run could not be carried out (sandbox problem)
    timings: dict[str, float] = field(default_factory=dict)  # start_s, scenario_s, close_s

    @property
    def died_at(self) -> str | None:
        for step in self.steps:
            if not step.thread_alive:
                return step.name
        return None

    @property
    def death(self) -> str | None:
        for step in self.steps:
            if step.exceptions:
                return _exception_line(step.exceptions[0])
        return None

    @property
    def final_states(self) -> dict[int, int]:
        return self.steps[-1].room_states if self.steps else {}

    def stuck_rooms(self) -> list[int]:
        return [room for room in (3, 4) if self.final_states.get(room) == BOOTSTRAPPING]

    def summary(self) -> str:
        if self.error:
            return f"could not run: {self.error}"
        states = ", ".join(f"{r}={state_name(self.final_states.get(r))}" for r in ROOMS)
        if self.died_at:
            stuck = f"; rooms {self.stuck_rooms()} stuck in Bootstrapping" if self.stuck_rooms() else ""
            return f"bootstrap thread died at '{self.died_at}' ({self.death}){stuck}; final rooms {states}"
        return f"bootstrap thread alive after every step; final rooms {states}"

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "error": self.error,
            "died_at": self.died_at,
            "death": self.death,
            "summary": self.summary(),
            "final_room_states": {str(k): state_name(v) for k, v in sorted(self.final_states.items())},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "steps": [s.to_dict() for s in self.steps],
        }


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def patched_checks(run: RunReport) -> list[Check]:
    """What every patched run must show."""
    if run.error:
        return []
    final = run.final_states
    alive = [s.name for s in run.steps if not s.thread_alive]
    checks = [
        Check("thread alive after every step", not alive, f"dead after: {alive}" if alive else "alive"),
        Check("room 2 Failed", final.get(2) == FAILED, state_name(final.get(2))),
    ]
    for room in (3, 4):
        checks.append(Check(f"room {room} WaitingForInput", final.get(room) == WAITING_FOR_INPUT, state_name(final.get(room))))
    return checks


@dataclass
class VerifyResult:
    release: str
    unpatched: RunReport
    patched: RunReport
    checks: list[Check]
    verdict: Verdict
    reasons: list[str]
    elapsed_s: float
    patch_steps: list[dict] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"PASS": GOOD, "FAIL": BAD, "INCONCLUSIVE": INCONCLUSIVE}[self.verdict]

    @property
    def unpatched_dies_on_abort(self) -> bool:
        return self.unpatched.died_at == ABORT_STEP

    @property
    def abort_from_release_decode(self) -> bool:
        """Whether the ABORT frame came from this release's own decode code (0.5.13+)."""
        step = next((s for s in self.unpatched.steps if s.name == ABORT_STEP), None)
        return step is not None and step.note is None

    @property
    def vulnerable(self) -> bool:
        """Same-version P/D is wedged by its own decode's ABORT: the incident's window, from behaviour."""
        return self.unpatched_dies_on_abort and self.abort_from_release_decode

    def to_dict(self) -> dict:
        return {
            "release": self.release,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reasons": self.reasons,
            "elapsed_s": round(self.elapsed_s, 3),
            "unpatched_dies_on_abort": self.unpatched_dies_on_abort,
            "abort_from_release_decode": self.abort_from_release_decode,
            "vulnerable": self.vulnerable,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "patch_steps": self.patch_steps,
            "runs": {"unpatched": self.unpatched.to_dict(), "patched": self.patched.to_dict()},
        }

    def to_frame(self):
        import pandas as pd

        rows = []
        for run in (self.unpatched, self.patched):
            for step in run.steps:
                row = {"run": run.kind, "step": step.name, "thread_alive": step.thread_alive}
                for room in ROOMS:
                    row[f"room_{room}"] = state_name(step.room_states.get(room))
                row["exceptions"] = "; ".join(_exception_line(e) for e in step.exceptions)
                rows.append(row)
        columns = ["run", "step", "thread_alive", *[f"room_{r}" for r in ROOMS], "exceptions"]
        return pd.DataFrame(rows, columns=columns)

    def headline(self) -> str:
        return f"sglang {self.release}: patch verify {self.verdict} ({self.elapsed_s:.1f}s)"

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        style = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow"}[self.verdict]
        table = Table(
            title=f"sglang {self.release}: bootstrap loop, unpatched vs patched",
            caption="rooms 1 2 3 4: B Bootstrapping, W WaitingForInput, F Failed, T Transferring, S Success, - absent",
        )
        table.add_column("step", no_wrap=True)
        for kind in ("unpatched", "patched"):
            table.add_column(f"{kind}\nthread", no_wrap=True)
            table.add_column("rooms\n1 2 3 4", no_wrap=True)
            table.add_column("raised", min_width=14, overflow="fold")
        by_name = {kind: {s.name: s for s in run.steps} for kind, run in (("u", self.unpatched), ("p", self.patched))}
        for scenario_step in SCENARIO:
            cells = [scenario_step.name]
            for key in ("u", "p"):
                step = by_name[key].get(scenario_step.name)
                if step is None:
                    cells += ["", "", ""]
                    continue
                cells.append("[green]alive[/]" if step.thread_alive else "[red]DEAD[/]")
                cells.append(" ".join(_state_letter(step.room_states.get(r)) for r in ROOMS))
                cells.append(", ".join(str(e.get("exc_type") or e.get("type") or "Exception") for e in step.exceptions))
            table.add_row(*cells)
        lines = [Text(self.headline(), style=style), table]
        lines += [Text(f"  {'ok ' if c.ok else 'BAD'} {c.name}: {c.detail}") for c in self.checks]
        lines += [Text(f"  unpatched: {self.unpatched.summary()}"), Text(f"  patched:   {self.patched.summary()}")]
        lines += [Text(f"  reason: {r}") for r in self.reasons]
        return Group(*lines)

    def _repr_html_(self) -> str:
        checks = "".join(
            f"<li>{'✔' if c.ok else '✘'} {html.escape(c.name)}: {html.escape(c.detail)}</li>" for c in self.checks
        )
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in self.reasons)
        return (
            f"<p><b>{html.escape(self.headline())}</b></p><ul>{checks}{reasons}</ul>"
            f"<p>unpatched: {html.escape(self.unpatched.summary())}<br>"
            f"patched: {html.escape(self.patched.summary())}</p>"
            + self.to_frame().to_html(index=False)
        )


# ----------------------------------------------------------------------------- running


def patched_file_for(source, original: Path) -> tuple[Path, list[dict]]:
    """The patched conn.py for this release, cached by the original's and the codemod's hashes."""
    from forensics.cache import cache_dir
    from patched_engine import codemod, snippets

    text = original.read_text(encoding="utf-8")
    digest = hashlib.sha256()
    for part in (text, Path(codemod.__file__).read_text(), Path(snippets.__file__).read_text()):
        digest.update(part.encode("utf-8"))
    directory = cache_dir() / "patched" / digest.hexdigest()[:24]
    target = directory / "conn.py"
    steps_file = directory / "steps.json"
    import json

    if target.is_file() and steps_file.is_file():
        return target, json.loads(steps_file.read_text())
    result = codemod.patch_source(text, source.version)
    steps = [s.to_dict() for s in result.steps]
    directory.mkdir(parents=True, exist_ok=True)
    from patched_engine.apply import atomic_write

    steps_file.write_text(json.dumps(steps))
    atomic_write(target, result.new_text)
    return target, steps


def run_scenario(source, conn_file: Path | None, kind: Literal["unpatched", "patched"]) -> RunReport:
    """One sandbox session (a fresh interpreter) through SCENARIO."""
    from forensics.sandbox import EngineSandbox, SandboxError

    report = RunReport(kind)
    clock = time.perf_counter()
    try:
        with EngineSandbox(source, backend="nixl", conn_file=conn_file) as sandbox:
            report.timings["start_s"] = time.perf_counter() - clock
            clock = time.perf_counter()
            seen_exceptions = 0
            seen_logs = 0
            for step in SCENARIO:
                note = step.run(sandbox)
                sandbox.settle()
                exceptions = sandbox.exceptions()
                logs = sandbox.log_records()
                report.steps.append(
                    StepReport(
                        name=step.name,
                        thread_alive=sandbox.thread_alive(),
                        room_states={int(k): int(v) for k, v in sandbox.room_states().items()},
                        exceptions=exceptions[seen_exceptions:],
                        logs=[r for r in logs[seen_logs:] if _level(r) >= 20],
                        note=note,
                    )
                )
                seen_exceptions, seen_logs = len(exceptions), len(logs)
            report.timings["scenario_s"] = time.perf_counter() - clock
            clock = time.perf_counter()
        report.timings["close_s"] = time.perf_counter() - clock
    except SandboxError as exc:
        report.error = str(exc)
    return report


def _level(record: dict) -> int:
    level = record.get("levelno", record.get("level", 0))
    if isinstance(level, str):
        import logging

        return logging.getLevelName(level) if isinstance(logging.getLevelName(level), int) else 0
    return int(level)


def verify_release(spec: str | Path) -> VerifyResult:
    """Run the scenario on the unpatched and the patched ``nixl/conn.py`` of one release."""
    from forensics.sglang_source import SourceError, resolve
    from patched_engine.codemod import PatchError

    started = time.perf_counter()

    def inconclusive(reason: str, release: str) -> VerifyResult:
        return VerifyResult(
            release=release,
            unpatched=RunReport("unpatched"),
            patched=RunReport("patched"),
            checks=[],
            verdict="INCONCLUSIVE",
            reasons=[reason],
            elapsed_s=time.perf_counter() - started,
        )

    try:
        source = resolve(spec)
        original = source.backend_file("nixl")
    except SourceError as exc:
        return inconclusive(f"could not get the release's source: {exc}", str(spec))
    # Two independent interpreters side by side; the unpatched one starts while the codemod
    # (or its cache) produces the patched file.
    with ThreadPoolExecutor(max_workers=2) as pool:
        unpatched_future = pool.submit(run_scenario, source, None, "unpatched")
        try:
            patched_file, patch_steps = patched_file_for(source, original)
        except PatchError as exc:
            unpatched_future.result()
            return inconclusive(f"the codemod refused this release's nixl/conn.py: {exc}", source.version)
        patched_future = pool.submit(run_scenario, source, patched_file, "patched")
        unpatched, patched = unpatched_future.result(), patched_future.result()

    elapsed = time.perf_counter() - started
    if patched.error:
        result = inconclusive(f"the sandbox could not run the patched file: {patched.error}", source.version)
        result.unpatched, result.patched, result.patch_steps = unpatched, patched, patch_steps
        return result
    checks = patched_checks(patched)
    failed = [c for c in checks if not c.ok]
    verdict: Verdict = "FAIL" if failed else "PASS"
    reasons = [f"patched: {c.name} failed ({c.detail})" for c in failed] or [
        "patched: thread alive throughout, room 2 Failed, rooms 3 and 4 WaitingForInput"
    ]
    if unpatched.error:
        reasons.append(f"unpatched run could not be carried out: {unpatched.error}")
    return VerifyResult(
        release=source.version,
        unpatched=unpatched,
        patched=patched,
        checks=checks,
        verdict=verdict,
        reasons=reasons,
        elapsed_s=elapsed,
        patch_steps=patch_steps,
    )
