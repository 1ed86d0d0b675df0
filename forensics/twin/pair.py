"""A mixed-version twin (a rolling upgrade): does the prefill's loop take what the decode sends?

Decided before anything starts, in the engine sandbox: the decode release's own code builds
its frames (``_register_kv_args``, ``send_metadata``, ``_send_abort_notification``) and the
prefill release's own bootstrap loop takes them, as in the deployment being upgraded.

* A frame every request needs (the KV-args registration, the transfer info) that kills the
  prefill's loop, or that it does not act on, makes the pair unservable: ``twin up`` refuses
  it and names the frame.
* The decode's ABORT is sent only when a request is aborted. A prefill loop that dies on it is
  exactly what a twin of this pair is for (it wedges on the first abort), so it is recorded as
  the pair's expected fate, not refused.

What the prefill sends back (NIXL notifications; KV status and ABORT_ACK in the releases that
have a decode listener) is not replayed here: the engine sandbox runs prefill loops only. The
twin's decode checks every request's KV pages, so a break in that direction shows as a failed
request with its reason, never as a silent hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The frames of a request's normal path, in the order a decode sends them.
SERVING_FRAMES = ("KV-args registration", "transfer info")
SERVING_ROOM, ABORTED_ROOM = 1, 2


@dataclass
class PairCheck:
    """What the prefill release's loop did with each frame the decode release sends."""

    prefill: str
    decode: str
    frames: dict[str, str] = field(default_factory=dict)  # frame -> what the loop did
    refused: str = ""  # why the pair cannot serve, naming the frame ("" when it can)
    abort_fate: str = ""  # "wedges on the first abort", "survives an abort", or why there is no ABORT

    @property
    def servable(self) -> bool:
        return not self.refused

    def summary(self) -> str:
        pair = f"prefill {self.prefill} / decode {self.decode}"
        if self.refused:
            return f"{pair}: cannot serve: {self.refused}"
        return f"{pair}: the prefill's loop takes every frame a request needs; {self.abort_fate}"

    def to_dict(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode, "frames": dict(self.frames),
                "servable": self.servable, "refused": self.refused, "abort_fate": self.abort_fate}


def _died_of(prefill) -> str:
    errors = prefill.exceptions()
    return errors[0]["message"] if errors else "no exception recorded"


def check_pair(prefill_source, decode_source) -> PairCheck:
    """Send the decode release's frames to the prefill release's NIXL bootstrap loop in the sandbox.

    Raises :class:`~forensics.sandbox.errors.SandboxError` when a release cannot be run here
    (the caller cannot then say the pair is servable).

    Example: ``check_pair(fx.sglang_source.fetch("0.5.15"), fx.sglang_source.fetch("0.5.16")).summary()``
    """
    from forensics.sandbox import EngineSandbox
    from forensics.sandbox.errors import SandboxError

    with EngineSandbox(decode_source) as decode, EngineSandbox(prefill_source) as prefill:
        check = PairCheck(prefill=prefill.version, decode=decode.version)
        prefill.create_rooms([SERVING_ROOM, ABORTED_ROOM])
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
        try:
            abort = decode.frames.abort(room=ABORTED_ROOM)
        except SandboxError as exc:
            check.abort_fate = f"no ABORT to survive ({exc})"
            return check
        prefill.send(abort)
        prefill.settle()
        if prefill.thread_alive():
            check.frames["ABORT"] = "taken"
            state = prefill.room_state_names().get(ABORTED_ROOM)
            check.abort_fate = f"it survives the decode's ABORT (the aborted room: {state})"
        else:
            check.frames["ABORT"] = f"the loop died: {_died_of(prefill)}"
            check.abort_fate = (f"its bootstrap_thread dies on the decode's ABORT ({_died_of(prefill)}): "
                                "this pair wedges on the first abort")
        return check
