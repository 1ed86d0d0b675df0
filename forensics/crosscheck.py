"""The handler map checked against live twins: does each release's loop die where the map says?

The handler map (``forensics.handlers``) predicts from a release's source what the prefill's
bootstrap loop does with the decode's ABORT and with a frame it does not know. This module
asks a running twin of that release and backend instead:

* **ABORT**: a streaming client killed while its KV transfer is pending, so the release's own
  decode decides whether to send ABORT and sends it (only where the map says it does); the
  outcome is whether the prefill's ``bootstrap_thread`` is alive afterwards, and only counts
  when the prefill's loop really took a frame after the kill;
* **foreign frame**: a two-frame message with a tag no release uses, pushed to the prefill's
  bootstrap socket (after a restart of the prefill when the ABORT killed its loop).

Each outcome is ``survived``, ``died``, ``not sent`` (the release's decode sends no ABORT) or
``undecided`` with the reason (the twin could not serve the release, the kill missed the
transfer wait three times, ...), and is compared with the map's prediction. An undecided
outcome is never counted as agreeing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SURVIVED, DIED, NOT_SENT, UNDECIDED = "survived", "died", "not sent", "undecided"
FOREIGN_FRAME = [b"PD-FORENSICS-FOREIGN", b"traffic"]
KILL_ATTEMPTS = 3


@dataclass
class Probe:
    """One frame kind sent to one twin: what the map predicted, what happened, and why."""

    predicted: str
    live: str = UNDECIDED
    detail: str = ""

    @property
    def agrees(self) -> bool | None:
        """True or False once decided; None when the live outcome is undecided."""
        if self.live == UNDECIDED:
            return None
        return self.live == self.predicted


@dataclass
class CrossCheck:
    release: str
    backend: str
    abort: Probe
    foreign: Probe
    served: str = ""  # what one request before the probes did ("completed with 200 in 0.41 s", ...)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_row(self) -> dict:
        return {"release": self.release, "backend": self.backend, "served": self.served,
                "abort_predicted": self.abort.predicted, "abort_live": self.abort.live,
                "abort_agrees": self.abort.agrees, "abort_detail": self.abort.detail,
                "foreign_predicted": self.foreign.predicted, "foreign_live": self.foreign.live,
                "foreign_agrees": self.foreign.agrees, "foreign_detail": self.foreign.detail,
                "seconds": round(self.seconds, 1)}


def predict(release: str, backend: str) -> tuple[str, str]:
    """The handler map's prediction for (ABORT, foreign frame) at the prefill's bootstrap loop."""
    from forensics import handlers

    row = handlers.matrix([release], progress=False).to_frame()
    row = row[row["backend"] == backend]
    if row.empty:
        raise ValueError(f"sglang {release} has no {backend} backend in the handler map")
    row = row.iloc[0]
    abort = NOT_SENT if not bool(row["decode_sends_abort"]) else (DIED if bool(row["abort_kills"]) else SURVIVED)
    foreign = DIED if bool(row["dies_on_unknown"]) else SURVIVED
    return abort, foreign


def _prefill_state(deployment) -> dict:
    return deployment.server_info("prefill")["internal_states"][0]["twin"]


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _send_abort(deployment, probe: Probe) -> None:
    from forensics.demo import kill_until_the_prefill_takes_a_frame

    # The decode fails the transfer; whether it sends ABORT is its release's decision, and the
    # prefill's loop must have taken a frame since the kill for the outcome to mean anything.
    taken, attempt, _ = kill_until_the_prefill_takes_a_frame(deployment, KILL_ATTEMPTS)
    if not taken:
        probe.detail = f"{KILL_ATTEMPTS} killed clients brought no ABORT to the prefill's loop"
        return
    alive = _wait_for(lambda: _prefill_state(deployment)["bootstrap_thread_alive"] is False, 5.0) is False
    probe.live = SURVIVED if alive else DIED
    probe.detail = f"killed client {attempt}: the prefill took the ABORT; bootstrap_thread " + (
        "alive" if alive else "dead")


def push_frames(deployment, frames: list[bytes]) -> int:
    """PUSH one multipart message to the twin prefill's bootstrap socket, as any peer could;
    returns how many messages its loop had taken before (to wait for this one)."""
    import zmq

    state = _prefill_state(deployment)
    context = zmq.Context()
    try:
        sock = context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(state["zmq_endpoint"])
        sock.send_multipart(frames)
        sock.close()
    finally:
        context.term()
    return state["frames_consumed"]


def _send_foreign(deployment, probe: Probe) -> None:
    if not _prefill_state(deployment)["bootstrap_thread_alive"]:
        deployment.restart("prefill")  # the ABORT killed the loop: a fresh one for this frame
    before = push_frames(deployment, FOREIGN_FRAME)
    if not _wait_for(lambda: _prefill_state(deployment)["frames_consumed"] > before, 10.0):
        probe.detail = "the prefill's loop never took the frame"
        return
    alive = _wait_for(lambda: _prefill_state(deployment)["bootstrap_thread_alive"] is False, 5.0) is False
    probe.live = SURVIVED if alive else DIED
    probe.detail = "bootstrap_thread " + ("alive" if alive else "dead") + " after the frame"


def _log_tail(deployment, lines: int = 3) -> str:
    try:
        return " | ".join(deployment.log_text("prefill").strip().splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


def cross_check(release: str, backend: str = "nixl", **twin_options) -> CrossCheck:
    """Bring up a twin of ``release`` and ``backend``, send the decode's ABORT and a foreign frame.

    Example: ``forensics.crosscheck.cross_check("0.5.15").to_row()``
    """
    from forensics import twin
    from forensics.exitcodes import EnvironmentProblem

    started = time.monotonic()
    abort_predicted, foreign_predicted = predict(release, backend)
    result = CrossCheck(release, backend, Probe(abort_predicted), Probe(foreign_predicted))
    try:
        deployment = twin.up(release, backend=backend, **twin_options)
    except EnvironmentProblem as exc:
        reason = f"no twin: {exc}"
        result.abort.detail = result.foreign.detail = reason
        result.seconds = time.monotonic() - started
        return result
    try:
        from forensics.demo import generate

        # Recorded, not required: a release that cannot serve (0.5.12's NIXL decode waits for state
        # data its prefill never sends) still aborts a request waiting for KV, and still reads frames.
        result.served = generate(deployment.router, timeout=30.0)[1]
        for probe, send in ((result.abort, _send_abort), (result.foreign, _send_foreign)):
            if probe is result.abort and abort_predicted == NOT_SENT:
                probe.live, probe.detail = NOT_SENT, "the release's decode sends no ABORT (from its source)"
                continue
            try:
                send(deployment, probe)
            except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError; bad JSON a ValueError
                # The twin itself stopped answering: say so (undecided), with its log's last words.
                probe.detail = f"the twin stopped answering ({exc}); prefill log ends: {_log_tail(deployment)}"
    finally:
        deployment.down()
        result.seconds = time.monotonic() - started
    return result
