"""Key facts of a log scan, in words: what died, what triggered it, what it cost.

Only reads the frames of a ``LogScan``; it never goes back to the sources.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from forensics.logs import eventtime

TRIGGERS = ("decode_transfer_aborted", "decode_handshake_aborted", "decode_transfer_timeout", "abort_sent",
            "client_disconnected", "scheduler_abort_request")
DEATHS = ("thread_death", "bootstrap_thread_died")
DUMPS = ("pyspy_dump_logged", "fatal_python_error")  # a thread dump follows each (forensics threads check)
TRIGGER_WINDOW = pd.Timedelta(minutes=10)


@dataclass
class Summary:
    facts: dict = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(f"- {s}" for s in self.sentences)

    def to_dict(self) -> dict:
        """Facts for JSON: rooms as strings of digits (JSON readers round big numbers)."""
        facts = dict(self.facts)
        if facts.get("rooms_affected") is not None:
            facts["rooms_affected"] = [str(room) for room in facts["rooms_affected"]]
        if facts.get("trigger"):
            trigger = dict(facts["trigger"])
            trigger["room"] = None if trigger.get("room") is None else str(trigger["room"])
            facts["trigger"] = trigger
        return {"facts": facts, "sentences": self.sentences}

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.sentences)
        return f"<div><b>Log summary</b><ul>{items}</ul></div>"

    def naming_sources(self, names: dict[str, str]) -> Summary:
        """The same summary with each ``source:line`` reference saying ``names[source]`` instead
        (a terminal names files by their short names; the facts keep the full paths)."""
        sentences = list(self.sentences)
        for source, name in names.items():
            if name != source:
                sentences = [s.replace(f"{source}:", f"{name}:") for s in sentences]
        return Summary(self.facts, sentences)

    def __rich__(self):
        from rich.panel import Panel
        from rich.text import Text

        # Text, not markup: sentences quote "[file:line]" and log text with brackets.
        return Panel(Text("\n".join(f"• {s}" for s in self.sentences)), title="Log summary", expand=False)


def _when(ts) -> str:
    return "at an unknown time" if pd.isna(ts) else f"at {ts.isoformat()}"


def _where(row) -> str:
    return f"{row['source']}:{row['line']}"


def summarise(scan) -> Summary:
    events = scan.events
    batches = scan.batches
    facts: dict = {}
    sentences: list[str] = []
    deaths = events[events["signature"].isin(DEATHS)]
    if len(deaths):
        first = _row(deaths, 0)
        earliest, last = eventtime.bounds(first)
        facts["first_thread_death"] = {
            "ts": None if earliest is None else earliest.isoformat(),
            "ts_upper": None if last is None or last == earliest else last.isoformat(),
            "thread": first["thread"],
            "message": first["message"], "host": first["host"], "role": first["role"], "where": _where(first),
            "ts_source": first["ts_source"], "count": int(len(deaths)),
        }
        sentences.append(
            f"First thread death {eventtime.when(first)} on {first['host']} "
            f"({first['role']}): {first['thread'] or 'a thread'} died with {first['message']!r} [{_where(first)}]."
            + (f" {len(deaths)} thread deaths in all." if len(deaths) > 1 else "")
        )
        # An inferred time is only a lower bound: a trigger may lie anywhere up to the death's latest.
        trigger = likely_trigger(events, earliest, last)
        if trigger is not None:
            relation = eventtime.relation_words(trigger, first)
            facts["trigger"] = {
                "signature": trigger["signature"], "ts": trigger["ts"].isoformat(),
                "room": None if pd.isna(trigger["room"]) else int(trigger["room"]),
                "role": trigger["role"], "where": _where(trigger), "relation": eventtime.order(trigger, first),
            }
            room = "" if pd.isna(trigger["room"]) else f" for room {int(trigger['room'])}"
            sentences.append(
                f"Likely trigger: {trigger['signature']}{room} on the {trigger['role']} {eventtime.when(trigger)}, "
                f"{relation} [{_where(trigger)}]."
            )
        else:
            sentences.append("No abort or timeout was logged before the death (trigger not in these logs; "
                             "DEBUG logging shows the ABORT send).")
    else:
        facts["first_thread_death"] = None
        sentences.append("No thread death found in these logs.")
    affected = events[events["room"].notna() & events["step"].isin(["trigger", "stall", "fallout", "abort_sent"])]
    rooms = sorted({int(r) for r in affected["room"]})
    facts["rooms_affected"] = rooms
    if rooms:
        shown = ", ".join(str(r) for r in rooms[:10]) + (" ..." if len(rooms) > 10 else "")
        sentences.append(f"{len(rooms)} bootstrap rooms appear in abort, stall or failure lines: {shown}.")
    # Only the columns read here: a batch frame has millions of rows and dozens of columns.
    wanted = [c for c in ("ts", "host", "new_seq", "new_token", "bootstrap_req") if c in batches.columns]
    prefill = batches.loc[(batches["kind"] == "prefill").to_numpy(), wanted] if len(batches) else batches
    if len(prefill):
        real = prefill[~((prefill["new_seq"] == 1) & (prefill["new_token"] == 1))] if "new_seq" in prefill else prefill
        probes = prefill[(prefill["new_seq"] == 1) & (prefill["new_token"] == 1)] if "new_seq" in prefill else prefill.iloc[:0]
        if len(real):
            last = _row(real, len(real) - 1)
            facts["last_real_prefill_batch"] = last["ts"].isoformat() if not pd.isna(last["ts"]) else None
            sentences.append(f"Last real prefill batch {_when(last['ts'])} on {last['host']}.")
            probes = probes[probes["ts"] > last["ts"]]
            after = f"After the last real prefill batch only {len(probes)}"
        else:
            facts["last_real_prefill_batch"] = None
            after = f"No real prefill batch in these logs; only {len(probes)}"
        if len(probes) and "bootstrap_req" in probes:
            grow = probes["bootstrap_req"].dropna()
            if len(grow) and grow.iloc[-1] > grow.iloc[0]:
                sentences.append(
                    f"{after} one-token health-probe batches ran, with #bootstrap-req "
                    f"going {int(grow.iloc[0])} -> {int(grow.iloc[-1])}: requests pile up in the bootstrap queue.")
                facts["probe_batches_after"] = int(len(probes))
    else:
        facts["last_real_prefill_batch"] = None
    if len(scan.access) and facts.get("first_thread_death") and facts["first_thread_death"]["ts"]:
        death_ts = pd.Timestamp(facts["first_thread_death"]["ts"])
        health = scan.access[(scan.access["path"].str.startswith("/health")) & (scan.access["minute"] >= death_ts.floor("min"))]
        if len(health):
            ok = int(health.loc[health["status"] == 200, "count"].sum())
            facts["health_200_after_death"] = ok
            sentences.append(f"/health answered 200 {ok} times from the minute of the death on: health checks did not see it.")
    unknown = scan.lines_unknown
    facts["lines_unknown"] = unknown
    facts["problems"] = [str(p) for p in scan.problems]
    dumps = events[events["signature"].isin(DUMPS)]
    facts["thread_dumps"] = [{"where": _where(_row(dumps, i)), "signature": str(dumps["signature"].iloc[i])}
                             for i in range(len(dumps))]
    if len(dumps):
        files = sorted({str(s) for s in dumps["source"]})
        roles = sorted({str(r) for r in dumps["role"] if not pd.isna(r)})
        role = roles[0] if len(roles) == 1 and roles[0] in ("prefill", "decode") else "prefill|decode"
        sentences.append(f"{len(dumps)} thread dump(s) in these logs (sglang's own py-spy output or faulthandler's, "
                         f"first at {_where(_row(dumps, 0))}): check them against the release's threads with "
                         f"`forensics threads check {' '.join(files)} --sglang X --role {role}`.")
    if unknown:
        sentences.append(f"{unknown} lines were in no known format (see problems).")
    if scan.problems:
        sentences.append(f"{len(scan.problems)} input problems: " + "; ".join(str(p) for p in scan.problems[:3])
                         + (" ..." if len(scan.problems) > 3 else ""))
    return Summary(facts=facts, sentences=sentences)


def likely_trigger(events: pd.DataFrame, earliest, latest=None) -> dict | None:
    """The abort or timeout most likely to have killed the thread that died in [earliest, latest].

    Inside the death's bounds the earliest candidate wins: a death follows its trigger within
    milliseconds, and later lines inside the bounds (a waiting timeout of a request the dead thread
    never bootstrapped) are its fallout. Without one inside, the latest before ``earliest``.
    """
    if earliest is None or pd.isna(earliest):
        return None
    latest = earliest if latest is None or pd.isna(latest) else latest
    candidates = events[events["signature"].isin(TRIGGERS) & events["ts"].notna()]
    candidates = candidates[(candidates["ts"] <= latest) & (candidates["ts"] >= earliest - TRIGGER_WINDOW)]
    if not len(candidates):
        return None
    # The abort lines with a room say most.
    with_room = candidates[candidates["room"].notna()]
    pick = with_room if len(with_room) else candidates
    inside = pick[pick["ts"] > earliest]
    if len(inside):
        return _row(inside, 0)
    return _row(pick, len(pick) - 1)


def _row(frame: pd.DataFrame, position: int) -> dict:
    """One row as a dict, read column by column: a whole-row Series could upcast a room to float."""
    return {name: frame[name].iloc[position] for name in frame.columns}
