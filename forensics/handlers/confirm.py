"""Dynamic confirmation of critical findings with the engine sandbox (the release's real loop).

Each critical finding is replayed in a fresh sandbox (the thread may die, so one per finding):
register a peer, send the frame the finding is about, settle, then ask whether the
bootstrap thread is alive and what it raised. The word recorded is the sandbox's
("died: AssertionError ...", "survived"); when the sandbox cannot run here it is
"not confirmed (...)" with the reason, never a guess.
"""

from __future__ import annotations

from dataclasses import replace

from forensics.handlers.model import CRITICAL, PREFILL, Finding, FrameShape

PLACEHOLDER = {"num": b"7", "text": b"127.0.0.1", "bytes": b"\x00"}
FOREIGN_FRAME = [b"PD_FORENSICS_FOREIGN", b"x"]
CONFIRMABLE_BACKENDS = ("nixl",)


def frames_from_shape(shape: FrameShape, room: int) -> list[bytes]:
    """Concrete frames for a statically built shape: constants as built, numbers as the room."""
    frames = []
    for position, element in enumerate(shape.elements):
        if element.kind == "const" and element.value is not None:
            frames.append(element.value)
        elif element.kind == "num" and position == 1:
            frames.append(str(room).encode())
        else:
            frames.append(PLACEHOLDER.get(element.kind, b"x"))
    return frames


def confirm(handler_map, source, findings: list[Finding] | None = None, settle_s: float = 10.0) -> list[Finding]:
    """Return the findings with ``confirmation`` filled in for the critical NIXL prefill ones."""
    findings = findings if findings is not None else handler_map.findings
    confirmed: list[Finding] = []
    for finding in findings:
        if finding.severity != CRITICAL or finding.backend not in CONFIRMABLE_BACKENDS or finding.receiver_role != PREFILL:
            confirmed.append(finding)
            continue
        confirmed.append(replace(finding, confirmation=_replay(handler_map, source, finding, settle_s)))
    return confirmed


def _frame_for(handler_map, finding: Finding, sandbox) -> list[bytes]:
    if finding.tag == "<unknown tag>":
        return list(FOREIGN_FRAME)
    if finding.tag == "ABORT":
        try:
            return sandbox.frames.abort(room=1)  # built by the release's own decode code
        except Exception:  # noqa: BLE001 - older releases have no abort builder; fall back to the static shape
            pass
    backend = handler_map.backend(finding.backend)
    for message in backend.sent:
        if message.tag == finding.tag and message.receiver_role == finding.receiver_role:
            return frames_from_shape(message.shape, room=1)
    return list(FOREIGN_FRAME)


def _replay(handler_map, source, finding: Finding, settle_s: float) -> str:
    try:
        from forensics.sandbox import EngineSandbox, SandboxError
    except ImportError as exc:  # pragma: no cover - the sandbox ships with the package
        return f"not confirmed (sandbox unavailable: {exc})"
    try:
        with EngineSandbox(source, backend=finding.backend) as sandbox:
            sandbox.create_rooms([1])
            sandbox.send(sandbox.frames.registration())
            sandbox.send(_frame_for(handler_map, finding, sandbox))
            status = sandbox.settle(settle_s)
            alive = sandbox.thread_alive()
            raised = sandbox.exceptions()
    except SandboxError as exc:
        return f"not confirmed (sandbox: {exc})"
    except Exception as exc:  # noqa: BLE001 - a sandbox that breaks is reported, not raised
        return f"not confirmed (sandbox failed: {type(exc).__name__}: {exc})"
    if not alive or status == "thread dead":
        if raised:
            first = raised[0]
            return f"died: {first.get('exc_type', '?')}: {first.get('message', '')}".strip()
        return "died"
    return "survived"
