"""The postmortem, in the Google SRE template's fields, built from an Investigation only.

Sections: summary, impact (requests affected, duration), root cause, trigger, detection (and why
health and the gauges missed it), resolution, timeline (from the evidence), action items (owner
left blank), lessons learned (what went well, wrong, lucky: placeholders for a person, pre-filled
only with facts the evidence backs), and the evidence appendix (kill chain, verdict signals and
gaps, handler diff, campaign table, plots). Nothing here reads a clock: the same investigation
gives the same postmortem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forensics.exitcodes import Undecided
from forensics.logs import eventtime

from .blocks import Bullets, Para, Placeholder, Plot, Section, Sub, Table
from .gauges import gauge_stories
from .investigation import Investigation
from .timefmt import span, stamp, utc

TIMELINE_ROWS = 300  # the most timeline rows shown (the rest are counted)
MESSAGE_CHARS = 200
_BAD = ("WEDGED", "DOWN", "DEGRADED")


@dataclass
class Postmortem:
    title: str
    facts: list[tuple[str, str]]  # the header table: name, value
    sections: list[Section] = field(default_factory=list)

    def section(self, key: str) -> Section:
        return next(s for s in self.sections if s.key == key)


@dataclass
class _Inputs:
    inv: Investigation
    evidence: Any
    verdict: dict[str, Any]
    verdict_name: str
    verdict_computed: bool
    diffs: dict[str, dict[str, Any]]
    campaigns: dict[str, dict[str, Any]]
    plots: dict[str, str]

    def frame(self, name: str) -> pd.DataFrame | None:
        if self.evidence is None:
            return None
        frame = self.evidence.frame(name)
        return frame if frame is not None and len(frame) else None


def _inputs(inv: Investigation) -> _Inputs:
    missing = inv.missing()
    if missing:
        raise Undecided(f"{missing[0]}: missing (listed in the investigation's manifest)"
                        + (f"; also missing: {', '.join(missing[1:])}" if len(missing) > 1 else ""))
    evidence = inv.evidence()
    verdicts = inv.verdicts()
    computed = False
    if verdicts:
        bad = [name for name in sorted(verdicts) if verdicts[name].get("verdict") in _BAD]
        name = bad[0] if bad else sorted(verdicts)[0]
        verdict = verdicts[name]
    elif evidence is not None:
        from forensics.diagnosis import decide

        name, verdict, computed = "computed", decide(evidence).to_dict(), True
    else:
        raise Undecided(f"{inv.directory}: the investigation holds no verdict and no evidence bundle "
                        "(add one with Investigation.add_verdict or add_bundle)")
    return _Inputs(inv, evidence, verdict, name, computed, inv.handler_diffs(), inv.campaigns(), inv.plots())


def build(inv: Investigation) -> Postmortem:
    """The postmortem of ``inv``; Undecided (exit 3) naming what is missing when it cannot be built."""
    x = _inputs(inv)
    v = x.verdict
    target = inv.info.get("target") or v.get("deployment") or (x.evidence.deployment.get("name") if x.evidence else "")
    release = inv.info.get("release") or (x.evidence.deployment.get("sglang", "") if x.evidence else "")
    backend = inv.info.get("backend") or (x.evidence.deployment.get("backend", "") if x.evidence else "")
    title = inv.info.get("title") or f"Postmortem: {target or 'deployment'} {v.get('verdict', '')}".strip()
    window = x.evidence.window if x.evidence is not None else {}
    facts = [("Target", str(target or "—")), ("sglang release", str(release or "—")),
             ("KV backend", str(backend or "—")),
             ("Verdict", f"{v.get('verdict')} ({'computed from the evidence bundle' if x.verdict_computed else x.verdict_name})"),
             ("Verdict time", utc(v.get("at"))),
             ("Evidence window", f"{utc((window or {}).get('since'))} to {utc((window or {}).get('until'))}"),
             ("Evidence collected", utc(x.evidence.collected_at) if x.evidence is not None else "no evidence bundle"),
             ("Investigation", f"created {utc(inv.info.get('created'))}, updated {utc(inv.info.get('updated'))}"),
             ("Status", "draft: the sections marked for a person are not written yet")]
    pm = Postmortem(title, facts)
    first = _first_signal(x)
    pm.sections = [_summary(x, target, release, backend), _impact(x, first), _root_cause(x), _trigger(x),
                   _detection(x), _resolution(x), _timeline(x), _actions(x), _lessons(x, first),
                   *_appendix(x, first)]
    return pm


# ---------------------------------------------------------------------------- facts


def _first_signal(x: _Inputs) -> pd.Timestamp | None:
    """The earliest time the evidence shows something wrong: a signal's time or a trigger/death event."""
    times = [stamp(s.get("at")) for s in x.verdict.get("signals", []) if s.get("kind") != "healthy"]
    events = x.frame("events")
    if events is not None:
        from forensics.logs.summary import DEATHS, TRIGGERS

        bad = events[events["signature"].isin(TRIGGERS + DEATHS) & events["ts"].notna()]
        if len(bad):
            times.append(stamp(bad["ts"].min()))
    times = [t for t in times if t is not None]
    return min(times) if times else None


def _evidence_end(x: _Inputs) -> pd.Timestamp | None:
    ends = [stamp(x.verdict.get("at"))]
    if x.evidence is not None:
        ends.append(stamp(x.evidence.collected_at))
        ends.append(stamp((x.evidence.window or {}).get("until")))
    probes = x.frame("probes")
    if probes is not None and probes["ts"].notna().any():
        ends.append(stamp(probes["ts"].max()))
    ends = [t for t in ends if t is not None]
    return max(ends) if ends else None


def _count(frame: pd.DataFrame | None, column: str, values: tuple[str, ...]) -> int:
    if frame is None or column not in frame:
        return 0
    return int(frame[column].astype(str).isin(values).sum())


def _room(value: Any) -> str:
    return "" if value is None or pd.isna(value) else str(int(value))


def _liveness(x: _Inputs) -> tuple[int, int]:
    probes = x.frame("probes")
    if probes is None:
        return 0, 0
    live = probes[probes["kind"].astype(str) == "liveness"]
    return int((live["outcome"].astype(str) != "ok").sum()), len(live)


def _health_ok(x: _Inputs) -> int:
    probes = x.frame("probes")
    if probes is None:
        return 0
    health = probes[probes["kind"].astype(str).isin(("health", "health_generate"))]
    return int((health["outcome"].astype(str) == "ok").sum())


def _findings(x: _Inputs) -> list[dict[str, Any]]:
    out = []
    for name in sorted(x.diffs):
        for f in x.diffs[name].get("findings", []):
            out.append(f)
    return sorted(out, key=lambda f: (bool(f.get("caveat")), str(f.get("backend")), str(f.get("tag")),
                                      str(f.get("file")), int(f.get("line") or 0)))


def _signals(x: _Inputs, name: str) -> list[dict[str, Any]]:
    return [s for s in x.verdict.get("signals", []) if s.get("name") == name]


# ---------------------------------------------------------------------------- sections


def _summary(x: _Inputs, target: str, release: str, backend: str) -> Section:
    v = x.verdict
    reasons = v.get("reasons") or ["(the verdict gave no reason)"]
    text = (f"The diagnosis of {target or 'the deployment'} (sglang {release or 'release unknown'}, "
            f"{backend or 'backend unknown'} backend) is {v.get('verdict')}: {reasons[0]}")
    blocks: list = [Para(text)]
    chain = v.get("kill_chain") or []
    if chain:
        blocks.append(Para(f"In short: {chain[0]}; then {chain[1]}." if len(chain) > 1 else f"In short: {chain[0]}."))
    for name, camp in sorted(x.campaigns.items()):
        blocks.append(Para(f"Validation campaign {name!r}: {camp.get('campaign')} ({camp.get('summary', '')})."))
    return Section("summary", "Summary", blocks)


def _impact(x: _Inputs, first: pd.Timestamp | None) -> Section:
    items = []
    failed, total = _liveness(x)
    if total:
        items.append(f"{failed} of {total} liveness probe(s) (a real one-token request) did not complete "
                     "(probes frame)")
    events = x.frame("events")
    if events is not None:
        timeouts = _count(events, "signature", ("decode_transfer_timeout",))
        aborts = _count(events, "signature", ("abort_sent", "decode_transfer_aborted", "decode_handshake_aborted",
                                              "scheduler_abort_request"))
        rooms = events["room"].dropna().nunique() if "room" in events else 0
        items.append(f"{timeouts} request(s) timed out waiting for KV and {aborts} abort(s) were logged, "
                     f"over {rooms} distinct bootstrap room(s) (events frame)")
    stuck = [s for s in (x.verdict.get("kill_chain") or []) if "bootstrap queue" in s]
    items += [f"{s} (kill chain)" for s in stuck]
    for name, camp in sorted(x.campaigns.items()):
        items.append(f"the validation campaign {name!r} aborted {camp.get('aborts', 0)} request(s) on purpose "
                     "(storm clients killed by the nemesis)")
    if not items:
        items.append("the investigation holds no probe, event or queue evidence of affected requests")
    end = _evidence_end(x)
    if first is not None and end is not None and x.verdict.get("verdict") in _BAD:
        duration = (f"at least {span((end - first).total_seconds())}: from the first signal at {utc(first)} to "
                    f"the end of the evidence at {utc(end)}; a wedge lasts until the prefill restarts, which the "
                    "evidence does not show")
    elif x.verdict.get("verdict") in _BAD:
        duration = "unknown: the evidence has no time for the first signal"
    else:
        duration = f"no impact window: the verdict is {x.verdict.get('verdict')}"
    return Section("impact", "Impact", [Para("Requests affected:"), Bullets(tuple(items)), Para(f"Duration: {duration}.")])


def _root_cause(x: _Inputs) -> Section:
    blocks: list = []
    # The deciding finding first, as the handler diff's headline orders them: a tag the loop does
    # not handle before a loop that dies on frames nobody sends.
    findings = sorted(_findings(x), key=lambda f: (bool(f.get("caveat")), f.get("kind") != "unhandled-tag"))
    if findings:
        rows = tuple((str(f.get("backend")), str(f.get("receiver_role")), str(f.get("tag")), str(f.get("fate")),
                      f"{f.get('file')}:{f.get('line')}", str(f.get("confirmation")),
                      str(f.get("summary")) + (f" (caveat: {f['caveat']})" if f.get("caveat") else ""))
                     for f in findings)
        blocks.append(Para(f"The handler diff shows {len(findings)} finding(s) in the bootstrap loops:"))
        blocks.append(Table(("backend", "role", "tag", "fate", "where", "sandbox", "finding"), rows))
    else:
        blocks.append(Para("No handler diff in the investigation: the code-level cause is not shown here "
                           "(add one with `forensics handlers diff --out DIR` and Investigation.add_handler_diff)."))
    deaths = (_signals(x, "thread_death_logged") + _signals(x, "bootstrap_thread_missing")
              + _signals(x, "bootstrap_thread_missing_logged"))
    if deaths:
        blocks.append(Para("What the evidence shows the cause did:"))
        blocks.append(Bullets(tuple(f"[{s.get('source')}] {s.get('engine')}: {s.get('says')}" for s in deaths)))
    return Section("root-cause", "Root cause", blocks)


def _trigger(x: _Inputs) -> Section:
    chain = x.verdict.get("kill_chain") or []
    from forensics.logs.summary import TRIGGERS

    first_step = next((step for step in chain if any(step.startswith(t) for t in TRIGGERS)), None)
    if first_step:
        return Section("trigger", "Trigger", [Para(f"{first_step} (the first step of the kill chain).")])
    events = x.frame("events")
    if events is not None:
        hits = events[events["signature"].isin(TRIGGERS) & events["ts"].notna()].sort_values("ts", kind="mergesort")
        if len(hits):
            row = hits.iloc[0]
            room = _room(row.get("room"))
            return Section("trigger", "Trigger", [Para(
                f"The first trigger in the logs: {row['signature']}{' for room ' + room if room else ''} on the "
                f"{row['role']} at {utc(row['ts'])} [{row['source']}:{row['line']}].")])
    return Section("trigger", "Trigger", [Para("The evidence shows no trigger (no abort, timeout or disconnect in "
                                               "the logs before the failure).")])


def _detection(x: _Inputs) -> Section:
    signals = [s for s in x.verdict.get("signals", []) if s.get("kind") != "healthy"]
    sources = sorted({str(s.get("source")) for s in signals})
    blocks: list = [Para(f"The verdict {x.verdict.get('verdict')} at {utc(x.verdict.get('at'))} rests on "
                         f"{len(sources)} independent source(s): {', '.join(sources) or 'none'}.")]
    if signals:
        blocks.append(Bullets(tuple(f"[{s.get('source')}] {s.get('engine')}: {s.get('says')}"
                                    f" ({utc(s.get('at'))})" for s in signals)))
    missed = []
    ok = _health_ok(x)
    if ok:
        missed.append(f"Health: {ok} health probe(s) answered 200 while the verdict was {x.verdict.get('verdict')}. "
                      "sglang's /health does not exercise the bootstrap path (its probe uses a fake transfer "
                      "backend), so it stays 200 when the bootstrap thread is dead.")
    elif x.frame("probes") is None:
        missed.append("Health: no probes in the evidence.")
    missed += _gauges_missed(x)
    blocks.append(Para("Why health and the gauges missed it:"))
    blocks.append(Bullets(tuple(missed)))
    return Section("detection", "Detection", blocks)


def _gauges_missed(x: _Inputs) -> list[str]:
    deaths = [pd.Timestamp(s["at"]) for s in _signals(x, "thread_death_logged") if s.get("at")]
    stories = gauge_stories(x.frame("metrics"), min(deaths) if deaths else None)
    if not stories:
        return ["Gauges: no queue gauges in the evidence."]
    return [story.sentence() for story in stories]


def _resolution(x: _Inputs) -> Section:
    if not x.campaigns:
        return Section("resolution", "Resolution", [
            Para("No validation campaign in the investigation: the evidence does not show a fix."),
            Placeholder("How was service restored (restart, rollback, patched engine)?")])
    rows = []
    for name, camp in sorted(x.campaigns.items()):
        deploy = camp.get("deploy") or {}
        check = (deploy.get("check") or {}) if isinstance(deploy, dict) else {}
        rows.append((name, str(camp.get("target") or camp.get("deployment") or ""), str(camp.get("campaign")),
                     f"{camp.get('cycles_run')}/{camp.get('cycles_planned')}",
                     f"{check.get('status')}: {check.get('reason')}" if check else "no deploy",
                     f"{utc(camp.get('started'))} to {utc(camp.get('finished'))}"))
    blocks: list = [Table(("campaign", "target", "result", "cycles", "deploy", "when"), tuple(rows))]
    passed = [n for n, c in sorted(x.campaigns.items()) if c.get("campaign") == "PASS"]
    if passed:
        blocks.append(Para(f"The campaign(s) {', '.join(passed)} passed every check of every cycle: the "
                           "deployment under test survived the abort storm."))
    blocks.append(Placeholder("How and when was production service restored?"))
    return Section("resolution", "Resolution", blocks)


def _timeline(x: _Inputs) -> Section:
    rows: list[tuple[pd.Timestamp, str, str, str]] = []
    events = x.frame("events")
    if events is not None:
        for row in events[events["ts"].notna()].itertuples(index=False):
            room = _room(getattr(row, "room", None))
            message = " ".join(str(row.message or "").split())
            if len(message) > MESSAGE_CHARS:
                message = message[: MESSAGE_CHARS - 1] + "…"
            what = f"{row.signature}{' room ' + room if room else ''}: {message} [{row.source}:{row.line}]"
            if getattr(row, "ts_source", None) == "inferred":  # placed at its lower bound; say both
                what += f" ({eventtime.when({'ts': row.ts, 'ts_source': 'inferred', 'ts_upper': getattr(row, 'ts_upper', None)})})"
            rows.append((stamp(row.ts), "log", str(getattr(row, "engine", None) or row.role), what))
    probes = x.frame("probes")
    if probes is not None:
        last: dict[tuple[str, str], str] = {}
        ordered = probes[probes["ts"].notna()].sort_values(["ts", "target", "kind"], kind="mergesort")
        for row in ordered.itertuples(index=False):
            key = (str(row.target), str(row.kind))
            if last.get(key) != str(row.outcome):
                last[key] = str(row.outcome)
                rows.append((stamp(row.ts), "probe", str(row.target), f"{row.kind} probe: {row.outcome}"))
    for s in x.verdict.get("signals", []):
        if stamp(s.get("at")) is not None:
            rows.append((stamp(s.get("at")), "signal", str(s.get("engine")), f"{s.get('name')}: {s.get('says')}"))
    if stamp(x.verdict.get("at")) is not None:
        rows.append((stamp(x.verdict.get("at")), "verdict", str(x.verdict.get("deployment") or ""),
                     f"verdict {x.verdict.get('verdict')}"))
    for name, camp in sorted(x.campaigns.items()):
        for cycle in camp.get("cycles", []):
            if stamp(cycle.get("started")) is not None:
                rows.append((stamp(cycle.get("started")), "campaign", name,
                             f"cycle {cycle.get('cycle')} started; its checks: {cycle.get('status')}"))
        if stamp(camp.get("finished")) is not None:
            rows.append((stamp(camp.get("finished")), "campaign", name, f"campaign {camp.get('campaign')}"))
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
    shown = rows[:TIMELINE_ROWS]
    note = f"{len(rows) - len(shown)} later row(s) not shown" if len(rows) > len(shown) else ""
    if not rows:
        return Section("timeline", "Timeline", [Para("The evidence holds no timed rows.")])
    return Section("timeline", "Timeline (UTC, from the evidence)", [
        Table(("time (UTC)", "source", "where", "what"), tuple((utc(t), s, w, what) for t, s, w, what in shown), note)])


def _actions(x: _Inputs) -> Section:
    rows: list[tuple[str, str, str, str]] = []
    for f in _findings(x):
        if f.get("kind") == "unhandled-tag":
            rows.append((f"Handle {f.get('tag')} in the {f.get('backend')} {f.get('receiver_role')} bootstrap loop",
                         "prevent", "", f"{f.get('file')}:{f.get('line')}"))
        else:
            rows.append((f"Make the {f.get('backend')} {f.get('receiver_role')} bootstrap loop survive unknown frames "
                         "(log and drop, never assert)", "prevent", "", f"{f.get('file')}:{f.get('line')}"))
    if _signals(x, "health_lies") or (_health_ok(x) and x.verdict.get("verdict") == "WEDGED"):
        rows.append(("Alert on a real one-token liveness request and on the bootstrap thread, not on /health",
                     "detect", "", "health 200 while WEDGED (detection)"))
    if (_signals(x, "bootstrap_thread_missing") or _signals(x, "thread_death_logged")
            or _signals(x, "bootstrap_thread_missing_logged")):
        rows.append(("Restart the prefill automatically when its bootstrap thread is gone", "mitigate", "",
                     "bootstrap thread death (kill chain)"))
    passed = [n for n, c in sorted(x.campaigns.items()) if c.get("campaign") == "PASS"]
    if passed:
        rows.append(("Roll out the validated patched engine", "mitigate", "", f"campaign {', '.join(passed)}: PASS"))
    elif x.verdict.get("verdict") in _BAD:
        rows.append(("Validate a fix with a campaign (forensics validate)", "mitigate", "", "no passing campaign"))
    for gap in x.verdict.get("gaps", []):
        rows.append((f"Collect {gap.get('piece')} next time: {gap.get('fix') or gap.get('reason')}", "process", "",
                     f"gap on {gap.get('target')}: {gap.get('reason')}"))
    if not rows:
        return Section("action-items", "Action items", [Placeholder("Which actions follow from this incident?")])
    return Section("action-items", "Action items", [
        Table(("action", "type", "owner", "evidence"), tuple(dict.fromkeys(rows)),
              "Owners are left blank for the team to assign."),
        Placeholder("Further action items, priorities and bug links.")])


def _lessons(x: _Inputs, first: pd.Timestamp | None) -> Section:
    verdict_at = stamp(x.verdict.get("at"))
    well, wrong, lucky = [], [], []
    if first is not None and verdict_at is not None:
        well.append(f"Time from the first signal ({utc(first)}) to the verdict ({utc(verdict_at)}): "
                    f"{span(max(0.0, (verdict_at - first).total_seconds()))}.")
    sources = sorted({str(s.get("source")) for s in x.verdict.get("signals", []) if s.get("kind") != "healthy"})
    if sources:
        well.append(f"The verdict rests on {len(sources)} independent source(s): {', '.join(sources)}.")
    if any(c.get("campaign") == "PASS" for c in x.campaigns.values()):
        well.append("A validation campaign passed on the fixed deployment.")
    ok = _health_ok(x)
    if ok and x.verdict.get("verdict") in _BAD:
        wrong.append(f"/health answered 200 {ok} time(s) while the verdict was {x.verdict.get('verdict')}.")
    for gap in x.verdict.get("gaps", []):
        wrong.append(f"Evidence missing: {gap.get('piece')} on {gap.get('target')}: {gap.get('reason')}.")
    return Section("lessons", "Lessons learned", [
        Sub("What went well"), Placeholder("What went well?", tuple(well)),
        Sub("What went wrong"), Placeholder("What went wrong?", tuple(wrong)),
        Sub("Where we got lucky"), Placeholder("Where did we get lucky?", tuple(lucky))])


def _appendix(x: _Inputs, first: pd.Timestamp | None) -> list[Section]:
    out = []
    chain = x.verdict.get("kill_chain") or []
    out.append(Section("kill-chain", "Appendix A: kill chain",
                       [Bullets(tuple(chain), numbered=True)] if chain else
                       [Para(f"No kill chain: the verdict is {x.verdict.get('verdict')}.")]))
    blocks: list = []
    for s in x.verdict.get("reasons", []):
        blocks.append(Para(str(s)))
    if x.verdict.get("signals"):
        blocks.append(Table(("signal", "source", "engine", "time (UTC)", "says"),
                            tuple((str(s.get("name")), str(s.get("source")), str(s.get("engine")), utc(s.get("at")),
                                   str(s.get("says"))) for s in x.verdict["signals"])))
    gaps = x.verdict.get("gaps") or []
    if gaps:
        blocks.append(Para("Not collected:"))
        blocks.append(Table(("piece", "target", "reason", "fix"),
                            tuple((str(g.get("piece")), str(g.get("target")), str(g.get("reason")), str(g.get("fix")))
                                  for g in gaps)))
    out.append(Section("verdict", "Appendix B: verdict, signals and gaps", blocks or [Para("No signals.")]))
    blocks = []
    for name, diff in sorted(x.diffs.items()):
        blocks.append(Para(f"Handler diff {name!r}: {diff.get('a')} versus {diff.get('b')} (sglang "
                           f"{diff.get('version')}): {diff.get('verdict')}."))
        gap_rows = [r for r in diff.get("rows", []) if r.get("gap")]
        if gap_rows:
            sides = [str(diff.get("a")), str(diff.get("b"))]
            blocks.append(Table(("role", "tag", "senders", *(f"{s} fate" for s in sides)),
                                tuple((str(r.get("role")), str(r.get("tag")), ", ".join(map(str, r.get("senders") or [])),
                                       *(_fate(r.get("cells", {}).get(s)) for s in sides)) for r in gap_rows),
                                f"{len(gap_rows)} of {len(diff.get('rows', []))} row(s) differ in a way that matters"))
        for u in diff.get("unreadable", []):
            blocks.append(Para(f"Unreadable: {u}"))
    out.append(Section("handler-diff", "Appendix C: handler diff",
                       blocks or [Para("No handler diff in the investigation.")]))
    blocks = []
    for name, camp in sorted(x.campaigns.items()):
        blocks.append(Para(f"Campaign {name!r}: {camp.get('campaign')}: {camp.get('summary', '')}"))
        rows = []
        for cycle in camp.get("cycles", []):
            for check in cycle.get("checks", []):
                rows.append((str(cycle.get("cycle")), str(check.get("name")), str(check.get("status")),
                             str(check.get("reason"))))
        if rows:
            blocks.append(Table(("cycle", "check", "status", "evidence"), tuple(rows)))
    out.append(Section("campaign", "Appendix D: validation campaign",
                       blocks or [Para("No validation campaign in the investigation.")]))
    out.append(_plots(x, first))
    return out


def _fate(cell: Any) -> str:
    if not isinstance(cell, dict):
        return "—" if cell is None else str(cell)
    where = f" ({cell.get('location')})" if cell.get("location") else ""
    return f"{cell.get('fate')}{where}"


def _plots(x: _Inputs, first: pd.Timestamp | None) -> Section:
    from .plots import gauges_plot, probes_plot, timeline_plot

    t0 = _t0(x)
    blocks: list = []
    svg = timeline_plot(x.frame("events"), t0)
    if svg:
        blocks.append(Plot("timeline", "Log events by role and signature over time (s)", svg))
    svg = probes_plot(x.frame("probes"), t0)
    if svg:
        blocks.append(Plot("probes", "Liveness versus health: probe wait (s) over time (s)", svg))
    svg = gauges_plot(x.frame("metrics"), t0)
    if svg:
        blocks.append(Plot("gauges", "PD queue gauges: requests (count) over time (s)", svg))
    for name, text in sorted(x.plots.items()):
        about = next((p.about for p in x.inv.of_kind("plot") if p.name == name), name)
        blocks.append(Plot(name, about, text))
    return Section("plots", "Appendix E: plots", blocks or [Para("No plots: no log events, probes, gauges or saved plots.")])


def _t0(x: _Inputs) -> pd.Timestamp | None:
    times = []
    for name in ("probes", "metrics", "events"):
        frame = x.frame(name)
        if frame is not None and "ts" in frame and frame["ts"].notna().any():
            times.append(stamp(frame["ts"].min()))
    times = [t for t in times if t is not None]
    return min(times) if times else None
