"""What to do now, for each verdict: recover first, then keep it from coming back.

A wedged prefill stays wedged until its process restarts: sglang has no way to restart a dead
``bootstrap_thread``. Its SIGTERM does not finish either (the tokenizer manager waits for the
stuck requests; docs/engine.md, measured on real sglang 0.5.15), so its stop lasts as long as
the supervisor's stop timeout before the SIGKILL. Then the decodes: a 0.5.15 or 0.5.15.post1 decode blocks
for good on a prefill that restarted under it (``patched_engine.decode_hazard`` reads it from the
source), so on those releases they restart after the prefills. The lasting fix is the patched bootstrap
loop or a release whose loop handles the decode's ABORT.
"""

from __future__ import annotations

from forensics.evidence import Evidence

from .signals import Signal

# The first release whose NIXL prefill bootstrap loop handles ABORT (tests/test_next_steps.py
# holds this against the handler matrix read from the releases' own source).
FIRST_FIXED_RELEASE = "0.5.16"
# decode_hazard: a decode of these blocks for good on a restarted prefill (tests/test_next_steps.py
# holds the list against decode_hazard.release_blocks over the window)
STALLING_DECODE_RELEASES = ("0.5.15", "0.5.15.post1")


def next_steps(verdict: str, signals: list[Signal], evidence: Evidence) -> list[str]:
    """The next steps in words, most urgent first; [] for HEALTHY."""
    release = evidence.deployment.get("sglang")
    if verdict == "WEDGED":
        return _wedged(signals, release)
    if verdict == "DOWN":
        down = sorted({s.engine for s in signals if s.kind == "down"})
        return [f"bring {', '.join(down) or 'the engine'} back (restart its unit or process), then read why it "
                "stopped: `forensics logs` on its log (a crash, an OOM kill and a stop from outside read differently)",
                "then `forensics diagnose` again: a restarted prefill of a vulnerable release can wedge on the next "
                "client that disconnects"]
    if verdict == "DEGRADED":
        return ["it still serves: read the findings above, and watch it (`forensics watch --inventory INV`) to see "
                "the moment it changes"]
    if verdict == "INCONCLUSIVE":
        fixes = []
        for gap in evidence.gaps:
            if gap.fix and gap.fix not in fixes:
                fixes.append(gap.fix)
        steps = [f"collect what was missing, then diagnose again: {fix}" for fix in fixes[:3]]
        return steps or ["add what would decide it (a liveness probe through the router, the prefill's log, a "
                         "py-spy dump of its scheduler) and diagnose again; `forensics init` checks an inventory"]
    return []


def _wedged(signals: list[Signal], release: str | None) -> list[str]:
    wedged = sorted({s.engine for s in signals if s.kind == "wedge" and s.engine and "prefill" in s.engine})
    who = ", ".join(wedged) or "the prefill engine(s) whose bootstrap thread died"
    steps = [f"recover now: restart {who}. It will not finish a SIGTERM while wedged (the stuck requests hold "
             "its shutdown), so the stop lasts your supervisor's stop timeout before the SIGKILL "
             "(`systemctl show -p TimeoutStopUSec UNIT`; 90 s by default); every request meanwhile hangs"]
    if release is None or release in STALLING_DECODE_RELEASES:
        stalling = " or ".join(STALLING_DECODE_RELEASES)
        steps.append("then restart the decodes" + ("" if release else f" if they run {stalling}") +
                     f": a {release or stalling} decode blocks for good on a prefill that restarted under it "
                     "(`forensics patch deploy --restart-decodes` does both, in that order)")
    steps.append(f"keep it from coming back: deploy the fix (`forensics patch deploy --inventory INV`, then "
                 f"`forensics validate`), or upgrade to {FIRST_FIXED_RELEASE} or later, whose bootstrap loop handles "
                 f"the decode's ABORT (`forensics upgrade-order --from {release or 'X'} --to {FIRST_FIXED_RELEASE}` "
                 "says which engines first); until then the next client that disconnects mid-transfer wedges it "
                 "again")
    return steps
