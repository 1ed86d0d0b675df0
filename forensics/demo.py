"""The incident demo: the whole story on one twin, from the wedge to the postmortem.

Six stages, each only library calls a notebook could make: **reproduce** (one client killed
while its KV transfer is pending wedges an unpatched twin running sglang's own bootstrap
loop; ``/health`` stays 200), **diagnose** (``fx.collect`` + ``fx.diagnose``: WEDGED),
**diff** (the NIXL and Mooncake loops side by side, the ABORT gap replayed in the engine
sandbox), **patch** (the codemod verified in the sandbox, deployed to the wedged twin, and
the same kill survived), **validate** (a storm campaign on the patched twin: PASS) and
**report** (the postmortem from the investigation the stages filled). The demo only
watches: each step records what it saw, and the story holds when every step saw what the
incident predicts.
"""

from __future__ import annotations

import html
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forensics.twin import clients

Progress = Callable[[str], None]


@dataclass
class Step:
    stage: str  # one of STAGES
    name: str
    ok: bool
    detail: str
    seconds: float


ENGINES = ("twin", "sglang")
ENGINE_WORDS = {"twin": "the twin", "sglang": "real sglang"}


def is_real(deployment) -> bool:
    """Whether ``deployment`` runs the real engine (its inventory's ``[twin] engine = "sglang"``)."""
    return getattr(deployment, "settings", None) is not None and deployment.settings.engine == "sglang"


@dataclass
class DemoResult:
    release: str
    engine: str = "twin"  # which engine ran the story: the twin, or real sglang (ENGINES)
    steps: list[Step] = field(default_factory=list)
    summary_sentences: list[str] = field(default_factory=list)
    directories: dict[str, str] = field(default_factory=dict)  # the twin's own files
    out: str = ""  # the demo's folder: investigation, report, demo.json
    report: str = ""  # the postmortem's HTML file
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(step.ok for step in self.steps)

    def to_dict(self) -> dict:
        return {"release": self.release, "engine": self.engine, "ok": self.ok, "seconds": round(self.seconds, 2),
                "steps": [step.__dict__ for step in self.steps], "log_summary": self.summary_sentences,
                "directories": self.directories, "out": self.out, "report": self.report}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([step.__dict__ for step in self.steps])

    def __rich__(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"Incident demo on {ENGINE_WORDS[self.engine]}, sglang {self.release} (NIXL)")
        for column in ("stage", "step", "result", "what we saw", "s"):
            table.add_column(column, overflow="fold")
        for step in self.steps:
            table.add_row(step.stage, step.name, Text("ok" if step.ok else "UNEXPECTED",
                                                     style="green" if step.ok else "bold red"),
                          Text(step.detail), f"{step.seconds:.1f}")
        verdict = (f"The story held on {ENGINE_WORDS[self.engine]}: one killed client wedged the deployment "
                   "while /health stayed 200, the diagnosis "
                   "said WEDGED, the patched engine survived the same kill and the storm campaign."
                   if self.ok else "The story did NOT hold; see the unexpected steps above.")
        parts = [table]
        if self.summary_sentences:
            parts.append(Panel(Text("\n".join(f"• {s}" for s in self.summary_sentences)),
                               title=f"What the wedged deployment's logs say ({ENGINE_WORDS[self.engine]}, "
                                     "forensics logs)", expand=False))
        parts.append(Text(f"{verdict} ({self.seconds:.0f} s)", style="bold green" if self.ok else "bold red"))
        if self.report:
            parts.append(Text(f"The postmortem: {self.report} (Markdown and PDF beside it); everything in {self.out}"))
        return Group(*parts)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{s.stage}</td><td>{html.escape(s.name)}</td><td>{'ok' if s.ok else '<b>UNEXPECTED</b>'}</td>"
            f"<td>{html.escape(s.detail)}</td><td>{s.seconds:.1f}</td></tr>" for s in self.steps)
        return (f"<table><caption>Incident demo on {ENGINE_WORDS[self.engine]}, sglang {self.release}</caption><tr><th>stage</th><th>step</th>"
                f"<th>result</th><th>what we saw</th><th>s</th></tr>{rows}</table>")


# ------------------------------------------------------------------------- client helpers


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_until(predicate, timeout: float, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    return None


def generate(router: str, timeout: float, prompt_tokens: int = 64) -> tuple[bool, str]:
    """One non-streaming request through the router: (completed, what happened)."""
    body = json.dumps({"input_ids": list(range(prompt_tokens)), "sampling_params": {"max_new_tokens": 8}}).encode()
    request = urllib.request.Request(router + "/generate", data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status == 200, f"completed with {response.status} in {time.monotonic() - started:.2f} s"
    except TimeoutError:
        return False, f"no answer within {timeout:.0f} s (hung)"
    except urllib.error.HTTPError as exc:
        # The engine's own reason (the decode's "Decode transfer failed ... with exception ...").
        try:
            reason = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError, OSError):
            reason = ""
        return False, f"failed with HTTP {exc.code} in {time.monotonic() - started:.2f} s" + (
            f": {reason}" if reason else "")
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            return False, f"no answer within {timeout:.0f} s (hung)"
        return False, f"failed: {exc.reason}"


def kill_client_during_transfer_wait(deployment, prompt_tokens: int = 20000, timeout: float = 30.0,
                                     on_close=None) -> str:
    """Open a streaming request, wait until the decode waits for its KV, then drop the client.

    On the twin, :func:`forensics.twin.clients.kill_client_during_transfer_wait` with a long
    prompt (20,000 tokens: about 4 s of prefill at the twin's default rate), which keeps the
    transfer pending long enough to catch it even on a loaded machine. On real sglang the decode's
    arrival counter says when the request is there (:func:`forensics.engine.state.kill_one_client`;
    the slow-prefill model's prefill of 3,000 tokens takes seconds).
    """
    if is_real(deployment):
        from forensics.engine import state

        return state.kill_one_client(deployment, on_close=on_close)
    return clients.kill_client_during_transfer_wait(deployment, prompt_tokens, timeout, on_close)


KILL_ATTEMPTS = 3
REAL_MODEL = "slow-prefill"  # its prefill of 3,000 tokens takes seconds: the window a kill must hit
REAL_HANG_TIMEOUT_S = 60.0  # a healthy real engine answers a short request well within this, loaded
REAL_REQUEST_TIMEOUT_S = 180.0  # the first requests after a (re)start are slow on 2 shared cores


def kill_until_the_prefill_takes_a_frame(deployment, attempts: int = KILL_ATTEMPTS) -> tuple[bool, int, str]:
    """Kill streaming clients during their transfer wait until the prefill's bootstrap loop has
    taken a frame since a kill (the decode's ABORT, where its release sends one), at most
    ``attempts`` times: on a loaded machine a kill can land outside the wait, and then nothing is
    aborted. Returns (a frame taken, clients killed, the last kill's detail)."""
    def consumed() -> int:
        if is_real(deployment):
            from forensics.engine import state

            return state.prefill_frames(deployment)
        return clients.twin_state(deployment.prefill)["frames_consumed"]

    detail = ""
    for attempt in range(1, attempts + 1):
        before = consumed()
        detail = kill_client_during_transfer_wait(deployment)
        if "decode aborted" in detail and _wait_until(lambda seen=before: consumed() > seen, 10.0):
            return True, attempt, detail
    return False, attempts, detail


# ------------------------------------------------------------------------------ the story

STAGES = ("reproduce", "diagnose", "diff", "patch", "validate", "report")


def default_out() -> Path:
    """A fresh folder in the working directory, named by the UTC time: a demo never overwrites another."""
    from datetime import UTC, datetime

    return Path(f"forensics-demo-{datetime.now(UTC):%Y%m%d-%H%M%S}")


def run(release: str = "0.5.15", *, out: str | Path | None = None, directory: str | Path | None = None,
        progress: Progress | None = None, hang_timeout: float | None = None, sessions: int = 12,
        cycles: int = 1, engine: str = "twin") -> DemoResult:
    """The whole story on one deployment of ``release``: reproduce, diagnose, diff, patch, validate, report.

    ``engine``: ``twin`` (the default) or ``sglang``, real sglang's prefill, decode and mini LB
    serving the slow-prefill model (:mod:`forensics.engine.deployment`; minutes, not seconds).
    The diff stage's second kill runs on a Mooncake twin either way (the real engine runs NIXL only).

    ``out`` receives the investigation, the postmortem (``report/report.{md,html,pdf}``) and
    ``demo.json`` (a fresh ``forensics-demo-<time>`` folder when not given); ``directory``
    keeps the twin's own files (its logs included; ``out/twin`` by default). ``sessions``
    and ``cycles`` size the validation campaign. Every stage runs and records what it saw,
    even after an earlier one went wrong, so the report always says what was found.

    Example: ``fx.demo.run("0.5.15", out="demo-out").report``
    """
    from forensics import twin
    from forensics.exitcodes import UsageProblem, environment_problem_from_os_error
    from forensics.report import Investigation

    if engine not in ENGINES:
        raise UsageProblem(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    real = engine == "sglang"
    if hang_timeout is None:  # how long a request may take before it counts as hung
        hang_timeout = REAL_HANG_TIMEOUT_S if real else 5.0
    say = progress or (lambda message: None)
    result = DemoResult(release=release, engine=engine)
    started = time.monotonic()
    out = Path(out) if out is not None else default_out()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise environment_problem_from_os_error(exc, str(out), "cannot write the demo folder") from None
    result.out = str(out)
    twin_directory = Path(directory) if directory else out / ("engine" if real else "twin")
    what = f"real sglang {release}" if real else f"twin of sglang {release}"
    investigation = Investigation(out / "investigation", target=what, release=release, backend="nixl",
                                  title=f"The NIXL bootstrap wedge on sglang {release} "
                                        f"({'real engine' if real else 'twin'} demo)")
    story = _Story(result, say, investigation)

    say(f"starting {what} (unpatched)")
    t0 = time.monotonic()
    if real:
        from forensics.engine import deployment as real_engine

        started_deployment = real_engine.up(release, directory=twin_directory, model_size=REAL_MODEL)
    else:
        started_deployment = twin.up(release, directory=twin_directory)
    with started_deployment as deployment:
        result.directories["engine" if real else "twin"] = str(deployment.directory)
        story.step("reproduce", "sglang up (real engine)" if real else "twin up", True,
                   f"router {deployment.router}, ready in {deployment.timings['total']:.1f} s", t0)
        story.stage("reproduce", _reproduce, deployment, hang_timeout)
        story.stage("diagnose", _diagnose, deployment, started_at=time.time() - (time.monotonic() - started))
        story.stage("diff", _diff, release)
        story.stage("patch", _patch, deployment, release)
        story.stage("validate", _validate, deployment, sessions, cycles)
    story.stage("report", _report, out)
    result.seconds = time.monotonic() - started
    (out / "demo.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result


class _Story:
    """Records each step; runs each stage so that a failure is a step, and the stages after it still run."""

    def __init__(self, result: DemoResult, say: Progress, investigation) -> None:
        self.result, self.say, self.investigation = result, say, investigation
        self.deaths_before_patch = 0  # thread deaths the wedge left in the logs (tracebacks carry no time)

    def step(self, stage: str, name: str, ok: bool, detail: str, since: float) -> None:
        self.result.steps.append(Step(stage, name, bool(ok), detail, time.monotonic() - since))
        self.say(f"[{stage}] {name}: {detail}")

    def stage(self, stage: str, body, *args, **kwargs) -> None:
        self.say(f"[{stage}] ...")
        t0 = time.monotonic()
        try:
            body(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - one stage's failure is recorded; the story goes on
            # The exception's words are the evidence a reader needs; later stages still run.
            self.step(stage, "stopped", False, f"{type(exc).__name__}: {exc}", t0)


def _bootstrap_alive(deployment) -> bool | None:
    if is_real(deployment):  # real sglang has no state page: py-spy of the prefill's scheduler
        from forensics.engine import state

        return state.bootstrap_thread_alive(deployment)
    return clients.twin_state(deployment.prefill)["bootstrap_thread_alive"]


def _request_timeout(deployment) -> float:
    return REAL_REQUEST_TIMEOUT_S if is_real(deployment) else 30.0


def _poll(deployment) -> float:
    """Between two looks at a deployment's state: a py-spy dump of a real scheduler is not free."""
    return 1.0 if is_real(deployment) else 0.05


def _health_codes(deployment) -> dict[str, int]:
    return {role: _get(getattr(deployment, role) + "/health", timeout=30.0)[0] for role in ("prefill", "decode", "router")}


def _reproduce(story: _Story, deployment, hang_timeout: float) -> None:
    from forensics.logs import scan

    t0 = time.monotonic()
    completed, detail = generate(deployment.router, timeout=_request_timeout(deployment))
    story.step("reproduce", "a request before the kill", completed, detail, t0)
    t0 = time.monotonic()
    attempts, detail = 0, ""
    # On a loaded machine a kill can land outside the transfer wait, and then nothing is
    # aborted: kill another client, as a storm would.
    while attempts < KILL_ATTEMPTS and _bootstrap_alive(deployment):
        attempts += 1
        detail = kill_client_during_transfer_wait(deployment)
        _wait_until(lambda: _bootstrap_alive(deployment) is False, 20.0, _poll(deployment))
    story.step("reproduce", "kill one streaming client", "decode aborted" in detail,
               detail + (f" ({attempts} clients killed)" if attempts > 1 else ""), t0)
    t0 = time.monotonic()
    dead = _bootstrap_alive(deployment) is False
    story.step("reproduce", "prefill bootstrap thread", dead,
               "died (sglang's own bootstrap_thread)" if dead else "still alive (expected it to die)", t0)
    t0 = time.monotonic()
    codes = _health_codes(deployment)
    story.step("reproduce", "/health", all(code == 200 for code in codes.values()),
               ", ".join(f"{role} {code}" for role, code in codes.items()), t0)
    t0 = time.monotonic()
    completed, detail = generate(deployment.router, timeout=hang_timeout)
    story.step("reproduce", "a new request after the kill", not completed, detail, t0)
    t0 = time.monotonic()
    logs = scan(sorted(deployment.directory.glob("*.log")))
    deaths = logs.events[logs.events["signature"] == "thread_death"]
    found = len(deaths) > 0 and "Foreign traffic?" in str(deaths.iloc[0]["message"])
    where = f"{Path(deaths.iloc[0]['source']).name}:{deaths.iloc[0]['line']}" if len(deaths) else "-"
    story.deaths_before_patch = len(deaths)
    story.step("reproduce", "forensics logs", found,
               f"thread death found: {deaths.iloc[0]['thread']} {deaths.iloc[0]['message']} [{where}]"
               if found else "no thread death in the logs", t0)
    story.result.summary_sentences = logs.summary().sentences


def _diagnose(story: _Story, deployment, started_at: float) -> None:
    import forensics as fx

    t0 = time.monotonic()
    evidence = fx.collect(deployment, since=started_at, sample_s=2)
    verdict = fx.diagnose(evidence)
    which = ENGINE_WORDS[_engine(deployment)]
    story.investigation.add_bundle(evidence, about=f"collected from the wedged deployment ({which})")
    story.investigation.add_verdict(verdict, about=f"the wedged deployment's diagnosis ({which})")
    reason = verdict.reasons[0] if verdict.reasons else ""
    story.step("diagnose", "collect + diagnose", verdict.verdict == "WEDGED",
               f"{verdict.verdict}" + (f": {reason}" if reason else ""), t0)


def _diff(story: _Story, release: str) -> None:
    import forensics as fx

    t0 = time.monotonic()
    handler_diff = fx.handlers.diff(release, confirm=True)
    story.investigation.add_handler_diff(handler_diff)
    headline = handler_diff.headline()
    gap = next((line for line in headline if "ABORT" in line and "dies" in line), None)
    story.step("diff", "NIXL vs Mooncake handlers", gap is not None,
               (gap or f"no ABORT gap found; first finding: {headline[0] if headline else '-'}")
               + " (confirmed in the engine sandbox)" * bool(gap and _confirmed(handler_diff)), t0)
    _mooncake_kill(story, release)


@dataclass
class KillOutcome:
    """One killed client on a twin of ``release`` and ``backend``: what its prefill's loop did."""

    release: str
    backend: str
    abort_reached: bool  # the prefill's loop took a frame after the kill (the decode's ABORT)
    bootstrap_alive: bool | None
    room: int | None  # the aborted room (63-bit, from the decode's log)
    room_failed: bool  # the prefill's loop marked it Failed (its ABORT case)
    abort_ack: bool  # ... and sent ABORT_ACK back (where the release does)
    new_request: str  # what a request after the kill did
    completed: bool
    clients_killed: int

    @property
    def wedged(self) -> bool:
        return self.abort_reached and self.bootstrap_alive is False and not self.completed

    def sentence(self) -> str:
        if not self.abort_reached:
            return f"no ABORT reached the {self.backend} prefill after {self.clients_killed} killed client(s)"
        if self.wedged:
            return f"bootstrap thread DEAD after the ABORT (wedged); a new request {self.new_request}"
        return ((f"room {self.room} marked Failed" if self.room_failed else f"room {self.room} not marked Failed")
                + (", ABORT_ACK sent" if self.abort_ack else "")
                + f"; bootstrap thread {'alive' if self.bootstrap_alive else 'DEAD'}; a new request {self.new_request}")

    def to_dict(self) -> dict:
        row = dict(self.__dict__)
        row["room"] = None if self.room is None else str(self.room)  # 63-bit: exact as text
        row["wedged"] = self.wedged
        return row


def same_kill(release: str, backend: str = "nixl", **twin_options) -> KillOutcome:
    """Start a twin of ``release`` and ``backend``, kill one client mid-transfer, report what happened.

    Kills again (at most 3 clients) until the prefill's loop has taken a frame after a kill:
    on a loaded machine a kill can land outside the transfer wait.

    Example: ``[fx.demo.same_kill("0.5.14", b).sentence() for b in ("nixl", "mooncake")]``
    """
    import re

    from forensics import twin

    with twin.up(release, backend=backend, **twin_options) as deployment:
        reached, attempts, _ = kill_until_the_prefill_takes_a_frame(deployment, KILL_ATTEMPTS)
        # The loop dies, if it does, as it reads the frame: give it the moment it takes.
        dead = _wait_until(lambda: _bootstrap_alive(deployment) is False, 3.0)
        rooms = re.findall(r"Sent abort notification for room (\d+)", deployment.log_text("decode"))
        room = int(rooms[-1]) if rooms else None
        prefill_log = deployment.log_text("prefill")
        completed, after = generate(deployment.router, timeout=5.0 if dead else 30.0)
        return KillOutcome(
            release=release, backend=backend, abort_reached=reached, bootstrap_alive=not dead, room=room,
            room_failed=room is not None and f"Received abort notification for room {room}, marked as Failed"
            in prefill_log,
            abort_ack=room is not None and f"Sent ABORT_ACK for room {room}" in prefill_log,
            new_request=after, completed=completed, clients_killed=attempts)


def _mooncake_kill(story: _Story, release: str) -> None:
    """The same killed client on a Mooncake twin of the release: its loop has an ABORT case."""
    t0 = time.monotonic()
    outcome = same_kill(release, "mooncake")
    story.step("diff", "the same kill on a Mooncake twin",
               outcome.abort_reached and bool(outcome.bootstrap_alive) and outcome.room_failed and outcome.completed,
               outcome.sentence(), t0)


def _confirmed(handler_diff) -> bool:
    """Whether the sandbox replay saw the NIXL prefill loop die, as the static finding says."""
    return any(str(finding.confirmation or "").startswith("died") for finding in handler_diff.findings)


def _patch(story: _Story, deployment, release: str) -> None:
    import forensics as fx
    from forensics.logs import scan

    t0 = time.monotonic()
    verified = fx.patch.verify(release)
    story.step("patch", "verify in the engine sandbox", verified.status == "pass",
               f"{verified.status.upper()}: " + "; ".join(verified.reasons[:2]), t0)
    t0 = time.monotonic()
    # The wedge left requests waiting at the decode; sglang 0.5.15's decode blocks for good if one
    # of them sends its ABORT to the restarted prefill too soon (patched_engine.decode_hazard):
    # the deploy restarts such a decode after the prefill, as a live deploy should.
    record = fx.patch.deploy(deployment, restart_decodes=True)
    # The record's own message ("patched 1 prefill engine(s); liveness ok"); the steps, with
    # their paths, are in the record (demo.json would need them only to debug a failure).
    story.step("patch", "deploy to the wedged " + ("real engine" if is_real(deployment) else "twin"),
               record.status == "deployed",
               f"{record.status}: {record.message} ({len(record.steps)} steps: backup, write, compile check, "
               "restart, a real request)" if record.status == "deployed" else
               f"{record.status}: {record.message or record.problem}", t0)
    t0 = time.monotonic()
    # The requests the wedge stranded at the decode fail once it notices the restarted prefill;
    # their failures would pass for our kill's, so the proof is the prefill's own line: an
    # ABORT it received and handled. Kill again (as a storm would) until one arrives.
    if not is_real(deployment):  # the real deploy restarted the decode too (0.5.15): nothing stranded there
        _wait_until(lambda: clients.twin_state(deployment.decode)["transfer_queue"] == 0, 60.0)
    handled_before, attempts, detail = _aborts_handled(deployment), 0, ""
    while attempts < KILL_ATTEMPTS and _aborts_handled(deployment) == handled_before:
        attempts += 1
        detail = kill_client_during_transfer_wait(deployment)
        _wait_until(lambda: _aborts_handled(deployment) > handled_before, 20.0, _poll(deployment))
    received = _aborts_handled(deployment) > handled_before
    story.step("patch", "the same kill", received,
               ("client killed while its KV was pending; the decode's ABORT reached the patched prefill"
                if received else f"no ABORT reached the patched prefill ({detail})")
               + (f" ({attempts} clients killed)" if attempts > 1 else ""), t0)
    t0 = time.monotonic()
    alive = _wait_until(lambda: _bootstrap_alive(deployment), 5.0, _poll(deployment))
    story.step("patch", "prefill bootstrap thread", bool(alive),
               "alive after the ABORT" if alive else "DEAD after the ABORT", t0)
    t0 = time.monotonic()
    completed, detail = generate(deployment.router, timeout=_request_timeout(deployment))
    story.step("patch", "a new request after the kill", completed, detail, t0)
    t0 = time.monotonic()
    logs = scan(sorted(deployment.directory.glob("*.log")))
    deaths = int((logs.events["signature"] == "thread_death").sum()) - story.deaths_before_patch
    handled = int((logs.events["signature"] == "abort_received").sum())
    # The fix held only if the ABORT reached the loop and was handled, not merely if nothing died.
    story.step("patch", "forensics logs", deaths == 0 and handled > 0,
               f"{deaths} thread deaths since the deploy; {handled} ABORT handled at INFO by the patched loop", t0)


def _aborts_handled(deployment) -> int:
    """How many ABORTs the prefill's loop has logged as received (the patched loop logs each)."""
    from forensics.logs import scan

    if is_real(deployment):
        from forensics.engine import state

        return state.aborts_handled(deployment)
    events = scan([deployment.directory / "prefill.log"]).events
    return int((events["signature"] == "abort_received").sum())


def _validate(story: _Story, deployment, sessions: int, cycles: int) -> None:
    import forensics as fx

    t0 = time.monotonic()
    # Prompts long enough (about a second of the twin's prefill) that every killed client is
    # still waiting for its first token, so each kill is an abort at the decode; shorter ones
    # can finish before the nemesis strikes, and a campaign without aborts proves nothing.
    # The killed clients' prefills still run after the storm (sglang does not cancel them), so a
    # liveness request waits behind them: give it the time they take.
    if is_real(deployment):  # the storm's defaults: 3,000 tokens is seconds of the slow-prefill model's prefill
        campaign = fx.validate(deployment, cycles=cycles, sessions=sessions, max_tokens=16, phase="kv", kill_after=0)
    else:
        campaign = fx.validate(deployment, cycles=cycles, sessions=sessions, prompt_tokens=6000, max_tokens=16,
                               phase="kv", kill_after=0, sample_s=3, probe_deadline_s=30)
    story.investigation.add_campaign(campaign, about=f"the patched deployment ({ENGINE_WORDS[_engine(deployment)]}) "
                                                     "under the abort storm")
    story.step("validate", f"campaign, {sessions} sessions x {cycles} cycle(s)", campaign.status == "PASS",
               campaign.summary(), t0)


def _engine(deployment) -> str:
    return "sglang" if is_real(deployment) else "twin"


def _report(story: _Story, out: Path) -> None:
    from forensics.report import write_report

    t0 = time.monotonic()
    written = write_report(story.investigation, out / "report", formats="md,html,pdf")
    story.result.report = str(written.get("html", ""))
    story.step("report", "postmortem", all(path.is_file() and path.stat().st_size > 0 for path in written.values()),
               f"{out / 'report'}: " + ", ".join(path.name for path in written.values()), t0)
