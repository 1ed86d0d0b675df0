"""A mixed-version twin (a rolling upgrade): does each side take what the other sends?

Decided before anything starts, in both directions.

Decode → prefill, in the engine sandbox: the decode release's own code builds its frames
(``_register_kv_args``, ``send_metadata``, ``_send_abort_notification``) and the prefill
release's own bootstrap loop takes them, as in the deployment being upgraded.

* A frame every request needs (the KV-args registration, the transfer info) that kills the
  prefill's loop, or that it does not act on, makes the pair unservable: ``twin up`` refuses
  it and names the frame.
* The decode's ABORT is sent only when a request is aborted. A prefill loop that dies on it is
  exactly what a twin of this pair is for (it wedges on the first abort), so it is recorded as
  the pair's expected fate, not refused.

Prefill → decode. Whether the prefill's transfer worker sends a signal at all is control flow,
read from both releases' code (:mod:`forensics.twin.completion_signals`, ``ast`` on the cached
sources: running the worker needs a NIXL transfer between two engines, which is the twin itself).
What it sends is replayed in the engine sandbox where the pair uses the status message: the
prefill release's own ``conclude_transfer(Success)`` / ``conclude_failure`` push its bytes to the
decode sandbox's rank socket, where the decode release's own listener thread must make the room
Success / Failed.

* how a transfer's end reaches the decode: the NIXL notification ``{room}_aux`` (drained by the
  decode receiver's ``poll``, up to 0.5.22) or the prefill's ``KV_STATUS`` (read by the decode
  listener thread, 0.5.20+; the only signal a 0.5.23 prefill sends and a 0.5.23 decode takes).
  A decode that completes only on a signal the prefill never sends is refused, naming both
  sides' source lines: a 0.5.22 prefill behind a 0.5.23 decode (every request would time out in
  ``KVPoll.WaitingForInput``), a 0.5.23 prefill behind a 0.5.19 or older decode. A pair that
  completes on the status message alone (a 0.5.23 prefill behind a 0.5.20 to 0.5.23 decode) is
  refused too when the replayed message leaves the decode's room waiting;
* what the decode does with the prefill's status message on a FAILED transfer: taken by its
  listener, or unread (no listener before 0.5.20 by default), in which case a failure is learned
  only at the decode's waiting timeout (replayed where the decode's listener takes it). Recorded,
  not refused: requests serve while transfers succeed.

* the prefill's ``ABORT_ACK``, where the decode release holds an aborted request's KV pages
  for it (deferred KV release, on by default from 0.5.21): the decode release's own armed ABORT
  goes to the prefill's loop, the prefill release's own code answers (or not), and the decode
  release's own listener must count the ack (``is_abort_release_safe``). Across the
  0.5.21/0.5.22 boundary it does not, in either direction: a 0.5.22+ prefill sends no ack for a
  generation-less ABORT, and a 0.5.22+ decode ignores a generation-less ack. Each aborted
  request's pages then stay held until the decode's deferred-release timeout. Recorded, not
  refused: requests serve.

Not checked: the staging frames (``STAGING_REQ``, ``CHUNK_READY``), which the twin does not enable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# The frames of a request's normal path, in the order a decode sends them.
SERVING_FRAMES = ("KV-args registration", "transfer info")
SERVING_ROOM, ABORTED_ROOM, FAILED_ROOM = 1, 2, 3
ACK_DOES_NOT_COUNT = "none that counts"  # how prefill_to_decode["abort ack"] begins when the decode keeps waiting
STATUS_REPLY_WAIT_S = 15.0  # how long the decode's listener gets to apply a status message (a loaded machine)


@dataclass
class PairCheck:
    """What each release does with what the other sends: ``frames`` (decode → prefill, what the
    prefill's loop did with each) and ``prefill_to_decode`` (how a transfer's end reaches the decode,
    and its failure report)."""

    prefill: str
    decode: str
    frames: dict[str, str] = field(default_factory=dict)  # frame -> what the loop did
    prefill_to_decode: dict[str, str] = field(default_factory=dict)  # "completion", "transfer failure"
    refused: str = ""  # why the pair cannot serve, naming the frame ("" when it can)
    abort_fate: str = ""  # "wedges on the first abort", "survives an abort", or why there is no ABORT
    wedges: bool = False  # the prefill's loop died on the decode's ABORT

    @property
    def servable(self) -> bool:
        return not self.refused

    def summary(self) -> str:
        pair = f"prefill {self.prefill} / decode {self.decode}"
        if self.refused:
            return f"{pair}: cannot serve: {self.refused}"
        completion = self.prefill_to_decode.get("completion", "")
        ack = self.prefill_to_decode.get("abort ack", "")
        held = f"; ABORT_ACK: {ack}" if ack.startswith(ACK_DOES_NOT_COUNT) else ""
        return (f"{pair}: the prefill's loop takes every frame a request needs; transfers complete on "
                f"{completion}; {self.abort_fate}{held}")

    def to_dict(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode, "frames": dict(self.frames),
                "prefill_to_decode": dict(self.prefill_to_decode), "servable": self.servable,
                "refused": self.refused, "abort_fate": self.abort_fate, "wedges": self.wedges}


def _died_of(prefill) -> str:
    errors = prefill.exceptions()
    return errors[0]["message"] if errors else "no exception recorded"


def _decode_room_after(decode, room: int) -> str:
    """The decode's state for ``room`` once its listener made it terminal (Success or Failed), or the
    state it stayed in for :data:`STATUS_REPLY_WAIT_S`."""
    from forensics.sandbox.snapshot import KVPOLL_NAMES

    deadline = time.monotonic() + STATUS_REPLY_WAIT_S
    while True:
        state = KVPOLL_NAMES.get(decode.decode_states()["rooms"].get(room), "no room")
        if state in ("Success", "Failed") or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def _replay_status_messages(prefill, decode, check: PairCheck, *, success: bool, failure: bool) -> None:
    """The prefill release's own ``conclude_transfer(Success)`` / ``conclude_failure`` push its status
    message to the decode endpoint the room's transfer info named: the decode sandbox's rank
    socket, read there by the decode release's own listener thread. Whether the prefill's transfer
    worker makes the call at all is read from its code (``completion_signals``); this replay shows
    that the decode takes the bytes it would send."""
    prefill.send(decode.frames.transfer_info(room=FAILED_ROOM))
    prefill.settle()
    decode.listen_as_decode([SERVING_ROOM, FAILED_ROOM])
    if success:
        prefill.conclude(SERVING_ROOM, succeeded=True)
        state = _decode_room_after(decode, SERVING_ROOM)
        if state != "Success":
            check.refused = (f"the {check.decode} decode's listener does not complete a transfer on the "
                             f"{check.prefill} prefill's status message: replayed in the engine sandbox, the "
                             f"decode's room stays {state} (every request would time out in KVPoll.WaitingForInput)")
            return
        check.prefill_to_decode["completion"] += "; replayed in the engine sandbox: the decode's room went Success"
    if failure:
        prefill.conclude(FAILED_ROOM, succeeded=False)
        state = _decode_room_after(decode, FAILED_ROOM)
        check.prefill_to_decode["transfer failure"] += (
            f"; replayed in the engine sandbox: the decode's room went {state}")


def _listening(decode) -> None:
    """The decode release's listener thread on its rank socket, started once per check."""
    if not decode.decode_states()["listener_alive"]:
        decode.listen_as_decode([])


def _log_line(sandbox, text: str) -> str:
    """The first of the release's own log records containing ``text``, with its source line."""
    for record in sandbox.log_records():
        if text in record["message"]:
            return f"{record['message']!r} [{record.get('source', '?')}]"
    return ""


def _why_no_ack(prefill, decode, check: PairCheck, deferred: dict) -> str:
    """Why the decode will not count an ack, from either release's own flag or log line ("" while
    nothing says so yet)."""
    if not deferred["prefill"]:
        return f"the {check.prefill} prefill sends no ABORT_ACK (its deferred KV release is off by default or absent)"
    if ignored := _log_line(decode, "Generation-less ABORT_ACK"):
        return f"the {check.decode} decode ignores the prefill's ABORT_ACK, which carries no generation: {ignored}"
    if unanswered := _log_line(prefill, "Generation-less ABORT"):
        return (f"the {check.prefill} prefill sends no ABORT_ACK for the decode's ABORT, which carries no "
                f"generation: {unanswered}")
    return ""


def _check_abort_ack(prefill, decode, check: PairCheck, deferred: dict) -> None:
    """After the decode's armed ABORT was taken: does the prefill's answer free the decode's held
    pages? Recorded under ``prefill_to_decode["abort ack"]``."""
    from forensics.sandbox.errors import SandboxError

    try:
        _listening(decode)
    except SandboxError as exc:
        check.prefill_to_decode["abort ack"] = f"undecided: {exc}"
        return
    deadline = time.monotonic() + STATUS_REPLY_WAIT_S
    why = ""
    while not decode.abort_release_safe(ABORTED_ROOM):
        why = _why_no_ack(prefill, decode, check, deferred)
        if why:
            break
        if time.monotonic() > deadline:
            why = f"no ABORT_ACK the decode counts arrived within {STATUS_REPLY_WAIT_S:.0f} s of the replay"
            break
        time.sleep(0.05)
    if not why:
        check.prefill_to_decode["abort ack"] = (
            f"the {check.prefill} prefill's ABORT_ACK frees the decode's held pages at once (replayed in the "
            f"engine sandbox: the {check.decode} decode's listener counted it)")
        return
    timeout = deferred.get("timeout_s")
    held = f"{timeout:g} s" if isinstance(timeout, int | float) else "its default"
    check.prefill_to_decode["abort ack"] = (
        f"{ACK_DOES_NOT_COUNT}: {why}; the {check.decode} decode holds each aborted request's KV pages until its "
        f"deferred-release timeout (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT, {held})")


def check_pair(prefill_source, decode_source) -> PairCheck:
    """Send the decode release's frames to the prefill release's NIXL bootstrap loop in the sandbox,
    and read from both releases' code how a transfer's end reaches the decode.

    Raises :class:`~forensics.sandbox.errors.SandboxError` when a release cannot be run here
    (the caller cannot then say the pair is servable).

    Example: ``check_pair(fx.sglang_source.fetch("0.5.15"), fx.sglang_source.fetch("0.5.16")).summary()``
    """
    from forensics.sandbox import EngineSandbox
    from forensics.sandbox.errors import SandboxError
    from forensics.twin.completion_signals import AUX_NOTIFICATION, failure_report, pair_signals

    # Prefill → decode first (read from the code, no sandbox): recorded even when the replay
    # below refuses the pair on a decode frame, and refused after it otherwise.
    signals = pair_signals(prefill_source, decode_source)
    no_completion = signals.missing
    failure_text, failure_taken = failure_report(prefill_source, decode_source)
    prefill_to_decode = {"completion": signals.path or f"none: {no_completion}", "transfer failure": failure_text}
    # A pair whose transfers complete on the status message alone (a 0.5.23 prefill) has it replayed.
    completes_by_status = bool(signals.shared) and AUX_NOTIFICATION not in signals.shared
    with EngineSandbox(decode_source) as decode, EngineSandbox(prefill_source) as prefill:
        check = PairCheck(prefill=prefill.version, decode=decode.version, prefill_to_decode=prefill_to_decode)
        prefill.create_rooms([SERVING_ROOM, ABORTED_ROOM, FAILED_ROOM])
        builders = {"KV-args registration": decode.frames.registration,
                    "transfer info": lambda: decode.frames.transfer_info(room=SERVING_ROOM)}
        for name in SERVING_FRAMES:
            prefill.send(builders[name]())
            prefill.settle()
            if not prefill.thread_alive():
                check.frames[name] = f"the loop died: {_died_of(prefill)}"
                check.refused = (f"the {check.prefill} prefill's bootstrap_thread dies on the {check.decode} decode's "
                                 f"{name} frame ({_died_of(prefill)})")
                return check
            check.frames[name] = "taken"
        room_state = prefill.room_state_names().get(SERVING_ROOM)
        if room_state != "WaitingForInput":
            check.refused = (f"the {check.prefill} prefill does not act on the {check.decode} decode's transfer info: "
                             f"room {SERVING_ROOM} stays {room_state} (a request would wait for KV that never comes)")
            return check
        if no_completion:
            check.refused = no_completion
            return check
        if completes_by_status or failure_taken:
            _replay_status_messages(prefill, decode, check, success=completes_by_status, failure=failure_taken)
            if check.refused:
                return check
        # A decode that holds an aborted room's pages for the prefill's ack sends its armed ABORT
        # (0.5.22+ adds the generation), as it does with its release's defaults.
        deferred = {"prefill": prefill.info["deferred_kv_release"]["prefill"],
                    "decode": decode.info["deferred_kv_release"]["decode"],
                    "timeout_s": decode.info["deferred_kv_release"]["timeout_s"]}
        try:
            abort = decode.frames.abort(room=ABORTED_ROOM, armed=deferred["decode"], hold=deferred["decode"])
        except SandboxError as exc:
            check.abort_fate = f"no ABORT to survive ({exc})"
            return check
        prefill.send(abort)
        prefill.settle()
        if prefill.thread_alive():
            check.frames["ABORT"] = "taken"
            state = prefill.room_state_names().get(ABORTED_ROOM)
            check.abort_fate = f"it survives the decode's ABORT (the aborted room: {state})"
            if deferred["decode"]:
                _check_abort_ack(prefill, decode, check, deferred)
            else:
                check.prefill_to_decode["abort ack"] = (
                    f"not waited for: the {check.decode} decode frees an aborted request's KV pages at once "
                    "(its deferred KV release is off by default or absent)")
        else:
            check.frames["ABORT"] = f"the loop died: {_died_of(prefill)}"
            check.wedges = True
            check.abort_fate = (f"its bootstrap_thread dies on the decode's ABORT ({_died_of(prefill)}): "
                                "this pair wedges on the first abort")
        return check
