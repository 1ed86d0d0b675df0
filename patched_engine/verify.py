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

Every run says which NIXL agent the loop talked to (``RunReport.agent``): the real NIXL
over UCX, or the recording stand-in (``forensics.sandbox.host_memory.RecordingAgent``)
when NIXL is absent or switched off (``nixl=False``, ``PD_FORENSICS_SANDBOX_NIXL=off``).
Every sentence the result renders rests on what ran: a run that never started claims
no step, and a run cut short says how far it got.
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

from forensics.exitcodes import BAD, GOOD, INCONCLUSIVE, ExitStatus, environment_problem_from_os_error

KVPOLL_NAMES = {0: "Failed", 1: "Bootstrapping", 2: "WaitingForInput", 3: "Transferring", 4: "Success"}
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT = 0, 1, 2
FOREIGN_FRAME = [b"FOREIGN", b"pd-forensics verify"]
ROOMS = (1, 2, 3, 4)

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]
STATUS_WORD = {"PASS": "pass", "FAIL": "fail", "INCONCLUSIVE": "inconclusive"}  # the JSON ``status``
EXIT_STATUS = {"PASS": GOOD, "FAIL": BAD, "INCONCLUSIVE": INCONCLUSIVE}

# Which NIXL agent a run's loop talked to (``AgentInfo.kind``).
REAL_NIXL = "real"  # NIXL over UCX, KV regions in host memory
STAND_IN = "stand-in"  # RecordingAgent: records the agent calls, registers nothing, moves no data
NO_AGENT = "none"  # a backend without a NIXL agent (mooncake)
UNKNOWN_AGENT = "unknown"  # the run never started, so no agent was made


@dataclass(frozen=True)
class AgentInfo:
    """The NIXL agent one sandbox run used, as the sandbox child reported it (``EngineSandbox.info``)."""

    kind: str  # REAL_NIXL, STAND_IN, NO_AGENT or UNKNOWN_AGENT
    description: str  # the child's words: "nixl (real, UCX, host memory)", "recording stand-in (NIXL disabled)"
    nixl: str | None = None  # what NIXL import gave: "nixl_cu12 1.5.1 (real)", "unavailable", "disabled (...)"

    @classmethod
    def from_info(cls, info: dict) -> AgentInfo:
        description = str(info.get("agent") or "")
        lowered = description.lower()
        if lowered.startswith("recording stand-in") or "recordingagent" in lowered:
            kind = STAND_IN
        elif lowered.startswith("nixl") and "real" in lowered:
            kind = REAL_NIXL
        elif lowered.startswith("none"):
            kind = NO_AGENT
        else:
            kind = UNKNOWN_AGENT
        return cls(kind, description or "not reported by the sandbox", info.get("nixl"))

    @classmethod
    def not_started(cls, why: str = "no sandbox run started") -> AgentInfo:
        return cls(UNKNOWN_AGENT, f"none ({why})", None)

    def sentence(self) -> str:
        if self.kind == REAL_NIXL:
            return f"real NIXL over UCX ({self.description}; {self.nixl or 'nixl version not reported'})"
        if self.kind == STAND_IN:
            return (f"the recording stand-in, not NIXL ({self.description}): the loop's agent calls were "
                    "recorded, nothing was registered with NIXL")
        if self.kind == NO_AGENT:
            return f"no NIXL agent ({self.description})"
        return f"unknown: {self.description}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "description": self.description, "nixl": self.nixl}


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
    agent: AgentInfo = field(default_factory=AgentInfo.not_started)  # set once the sandbox has started

    @property
    def started(self) -> bool:
        """Whether at least one scenario step ran."""
        return bool(self.steps)

    @property
    def complete(self) -> bool:
        """Whether every scenario step ran."""
        return len(self.steps) == len(SCENARIO)

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
        """Rooms 3 and 4 still Bootstrapping at the end of a complete run (none claimed for a partial one)."""
        if not self.complete:
            return []
        return [room for room in (3, 4) if self.final_states.get(room) == BOOTSTRAPPING]

    def summary(self) -> str:
        """One sentence, every claim in it backed by a step that ran."""
        if not self.steps:
            return f"not run: {self.error}" if self.error else "not run"
        total, ran = len(SCENARIO), len(self.steps)
        states = ", ".join(f"{r}={state_name(self.final_states.get(r))}" for r in ROOMS)
        last = self.steps[-1].name
        if self.died_at:
            stuck = f"; rooms {self.stuck_rooms()} stuck in Bootstrapping" if self.stuck_rooms() else ""
            death = self.death or "no exception recorded"
            rooms = "final rooms" if ran == total else f"rooms after '{last}':"
            text = f"bootstrap thread died at '{self.died_at}' ({death}){stuck}; {rooms} {states}"
        elif ran == total:
            text = f"bootstrap thread alive after every step; final rooms {states}"
        else:
            text = f"bootstrap thread alive after each of the {ran} steps that ran (of {total}); rooms after '{last}': {states}"
        if ran < total:
            text += f"; stopped before '{SCENARIO[ran].name}'"
        if self.error:
            text += f"; the sandbox failed: {self.error}"
        return text

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "agent": self.agent.to_dict(),
            "steps_run": len(self.steps),
            "steps_total": len(SCENARIO),
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
    """What every patched run must show (nothing is checked on a run that did not complete)."""
    if run.error or not run.complete:
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
    def exit_status(self) -> ExitStatus:
        return EXIT_STATUS[self.verdict]

    @property
    def exit_code(self) -> int:
        return int(self.exit_status)

    @property
    def status(self) -> str:
        """The JSON ``status`` word: pass, fail or inconclusive."""
        return STATUS_WORD[self.verdict]

    @property
    def agent(self) -> AgentInfo:
        """The NIXL agent of the run the verdict is about (the patched one), else of the unpatched run."""
        if self.patched.agent.kind != UNKNOWN_AGENT or self.unpatched.agent.kind == UNKNOWN_AGENT:
            return self.patched.agent
        return self.unpatched.agent

    @property
    def unpatched_dies_on_abort(self) -> bool | None:
        """None when the unpatched run never reached the ABORT step (nothing to say)."""
        run = self.unpatched
        if run.died_at is not None:
            return run.died_at == ABORT_STEP
        if not any(s.name == ABORT_STEP for s in run.steps):
            return None
        return False

    @property
    def abort_from_release_decode(self) -> bool | None:
        """Whether the ABORT frame came from this release's own decode code (0.5.13+); None when no
        run reached the ABORT step."""
        for run in (self.unpatched, self.patched):
            step = next((s for s in run.steps if s.name == ABORT_STEP), None)
            if step is not None:
                return step.note is None
        return None

    @property
    def vulnerable(self) -> bool | None:
        """Same-version P/D is wedged by its own decode's ABORT: the incident's window, from behaviour.
        None when the runs that would show it did not get that far."""
        dies, own = self.unpatched_dies_on_abort, self.abort_from_release_decode
        if dies is False or own is False:
            return False
        if dies is None or own is None:
            return None
        return True

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "exit": self.exit_code,
            "release": self.release,
            "verdict": self.verdict,
            "nixl_agent": self.agent.to_dict(),
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

    def agent_lines(self) -> list[str]:
        """Which NIXL agent each run used; one line when both runs used the same kind."""
        runs = [run for run in (self.unpatched, self.patched) if run.agent.kind != UNKNOWN_AGENT]
        if not runs:
            return ["NIXL agent: none (no sandbox run started)"]
        if len(runs) == 2 and runs[0].agent == runs[1].agent:
            return [f"NIXL agent: {runs[0].agent.sentence()}"]
        return [f"NIXL agent ({run.kind}): {run.agent.sentence()}" for run in runs]

    def run_lines(self) -> list[str]:
        """The two runs' summaries, each saying only what its steps showed."""
        return [f"unpatched: {self.unpatched.summary()}", f"patched:   {self.patched.summary()}"]

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
                    cells += ["[dim]not run[/]", "", ""]
                    continue
                cells.append("[green]alive[/]" if step.thread_alive else "[red]DEAD[/]")
                cells.append(" ".join(_state_letter(step.room_states.get(r)) for r in ROOMS))
                cells.append(", ".join(str(e.get("exc_type") or e.get("type") or "Exception") for e in step.exceptions))
            table.add_row(*cells)
        lines = [Text(self.headline(), style=style)]
        lines += [Text(f"  {line}", style="bold" if self.agent.kind == REAL_NIXL else "bold yellow")
                  for line in self.agent_lines()]
        if self.unpatched.started or self.patched.started:
            lines.append(table)
        lines += [Text(f"  {'ok ' if c.ok else 'BAD'} {c.name}: {c.detail}") for c in self.checks]
        lines += [Text(f"  {line}") for line in self.run_lines()]
        lines += [Text(f"  reason: {r}") for r in self.reasons]
        return Group(*lines)

    def _repr_html_(self) -> str:
        checks = "".join(
            f"<li>{'✔' if c.ok else '✘'} {html.escape(c.name)}: {html.escape(c.detail)}</li>" for c in self.checks
        )
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in self.reasons)
        agents = "<br>".join(html.escape(line) for line in self.agent_lines())
        runs = "<br>".join(html.escape(line) for line in self.run_lines())
        frame = self.to_frame()
        table = frame.to_html(index=False) if len(frame) else "<p><i>no scenario step ran</i></p>"
        return (
            f"<p><b>{html.escape(self.headline())}</b><br>{agents}</p><ul>{checks}{reasons}</ul>"
            f"<p>{runs}</p>" + table
        )


# ----------------------------------------------------------------------------- running


def patched_file_for(source, original: Path) -> tuple[Path, list[dict]]:
    """The patched conn.py for this release, cached by the original's and the codemod's hashes."""
    from forensics.cache import cache_dir
    from forensics.sglang_source import verified_read_text
    from patched_engine import codemod, snippets

    text = verified_read_text(original)  # a cached release's file: checked against its recorded sha256
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


def run_scenario(source, conn_file: Path | None, kind: Literal["unpatched", "patched"], *,
                 nixl: bool = True) -> RunReport:
    """One sandbox session (a fresh interpreter) through SCENARIO.

    ``nixl=False`` runs as on a machine without NIXL (the recording stand-in agent); with
    ``nixl=True`` the real NIXL is used where it imports, and the stand-in where it does not.
    ``report.agent`` says which one ran.
    """
    from forensics.sandbox import EngineSandbox, SandboxError

    report = RunReport(kind)
    clock = time.perf_counter()
    try:
        with EngineSandbox(source, backend="nixl", conn_file=conn_file, nixl=nixl) as sandbox:
            report.agent = AgentInfo.from_info(sandbox.info)
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


def verify_release(spec: str | Path, *, nixl: bool = True) -> VerifyResult:
    """Run the scenario on the unpatched and the patched ``nixl/conn.py`` of one release.

    ``nixl=False`` runs both as on a machine without NIXL (the recording stand-in agent);
    the result's ``agent`` says which agent ran either way. Raises
    :class:`~forensics.exitcodes.EnvironmentProblem` when the patched file cannot be written
    to the cache; every other way the check cannot run is an INCONCLUSIVE result.
    """
    from forensics.sglang_source import CacheIntegrityError, SourceError, resolve
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
    except CacheIntegrityError:
        raise  # a cached file that cannot be trusted nor restored: exit 4 naming it, not "undecided"
    except SourceError as exc:
        return inconclusive(f"could not get the release's source: {exc}", str(spec))
    # Two independent interpreters side by side; the unpatched one starts while the codemod
    # (or its cache) produces the patched file.
    with ThreadPoolExecutor(max_workers=2) as pool:
        unpatched_future = pool.submit(run_scenario, source, None, "unpatched", nixl=nixl)
        try:
            patched_file, patch_steps = patched_file_for(source, original)
        except PatchError as exc:
            result = inconclusive(f"the codemod refused this release's nixl/conn.py: {exc}", source.version)
            result.unpatched = unpatched_future.result()  # it ran: shown as evidence, not as the verdict
            return result
        except OSError as exc:
            unpatched_future.result()
            raise environment_problem_from_os_error(exc, doing="cannot write the patched file") from exc
        patched_future = pool.submit(run_scenario, source, patched_file, "patched", nixl=nixl)
        unpatched, patched = unpatched_future.result(), patched_future.result()

    elapsed = time.perf_counter() - started
    if patched.error or not patched.complete:
        why = patched.error or f"only {len(patched.steps)} of {len(SCENARIO)} steps ran"
        result = inconclusive(f"the sandbox could not run the patched file: {why}", source.version)
        result.unpatched, result.patched, result.patch_steps = unpatched, patched, patch_steps
        return result
    checks = patched_checks(patched)
    failed = [c for c in checks if not c.ok]
    verdict: Verdict = "FAIL" if failed else "PASS"
    reasons = [f"patched: {c.name} failed ({c.detail})" for c in failed] or [
        "patched: thread alive throughout, room 2 Failed, rooms 3 and 4 WaitingForInput"
    ]
    if patched.agent.kind == STAND_IN:
        reasons.append(
            "NIXL was not used: the loop ran against the recording stand-in agent "
            f"({patched.agent.description}); its registrations were recorded, not made on NIXL over UCX"
        )
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
