"""How a NIXL decode learns that a prefill's KV transfer ended, and whether a prefill release sends it.

The prefill → decode half of a mixed-version pair's check (:mod:`forensics.twin.pair`). Two
signals exist in sglang's NIXL backend, and a release's decode may complete a request on one,
the other or both:

* the NIXL notification ``{room}_aux``: the prefill tags its last WRITE with it, the decode's
  receiver drains notifications in its ``poll`` (``update_transfer_status``) and completes once
  ``check_transfer_done`` sees the aux (with every KV chunk) in its ``TransferStatus``;
* the prefill's ``KV_STATUS`` message: its transfer worker concludes a room with
  ``KVPoll.Success`` and pushes ``[KV_STATUS, room, status, rank, reason]`` to the decode's PULL
  socket, where the decode's listener thread hands it to ``apply_prefill_status``.

A pair whose decode completes only on a signal its prefill never sends cannot serve: every
request waits in ``KVPoll.WaitingForInput`` until the decode's waiting timeout (the "silent hang"
the twin must refuse up front). Everything here is read from each release's own files (``ast`` on
the cached, checksummed sources, as :mod:`forensics.twin.release_check`), never from a version
list: whether the transfer worker sends a signal is control flow, and running the worker needs a
NIXL transfer between two engines, which is what the twin itself does once started. The bytes of
the status message are replayed in the engine sandbox by :func:`forensics.twin.pair.check_pair`.

Only the default (``early``) decode allocation policy is considered, the one the twin runs: with
``prefill_complete`` the common sender's ``clear`` also sends ``KV_STATUS`` (``common/conn.py``),
but that policy's ``BOOTSTRAP`` frame kills every NIXL prefill loop anyway.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from forensics.twin.release_check import ReleaseFiles

NIXL = "nixl/conn.py"
COMMON = "common/conn.py"
AUX_NOTIFICATION = "NIXL notification {room}_aux"
# The prefill's calls that push a status message to the decode (0.5.20+ names; 0.5.23 ends a
# successful transfer with ``conclude_transfer(..., status=KVPoll.Success)``).
STATUS_SENDERS = frozenset({"conclude_transfer", "send_kv_status_message", "sync_status_to_decode_endpoint"})


@dataclass(frozen=True)
class Signal:
    """One way a transfer's end travels from the prefill to the decode, and where a release's code has it."""

    name: str  # AUX_NOTIFICATION, or the status message's tag ("KV_STATUS")
    where: str  # "nixl/conn.py:1902"
    role: str = ""  # what the release's code does with it, for the refusal text

    def describe(self) -> str:
        return f"{self.name} ({self.where}, {self.role})" if self.role else f"{self.name} ({self.where})"


def _called_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_kvpoll_success(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "Success" and isinstance(node.value, ast.Name) \
        and node.value.id == "KVPoll"


def _method(release: ReleaseFiles, relative: str, class_name: str, method: str) -> ast.FunctionDef | None:
    cls = release.class_def(relative, class_name)
    if cls is None:
        return None
    return next((node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method), None)


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _called_name(node) == name]


def status_tag(release: ReleaseFiles) -> str | None:
    """The tag the release's NIXL status message starts with (``NixlKVManager.kv_status_msg_tag``,
    else ``CommonKVManager``'s), as text; None when the release has no status message or it is untagged."""
    for relative, class_name in ((NIXL, "NixlKVManager"), (COMMON, "CommonKVManager")):
        cls = release.class_def(relative, class_name)
        for node in cls.body if cls is not None else ():
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == "kv_status_msg_tag":
                value = node.value
                if isinstance(value, ast.Constant) and isinstance(value.value, bytes):
                    return value.value.decode("ascii", "replace")
                return None
    return None


def _status_name(release: ReleaseFiles) -> str:
    return status_tag(release) or "the untagged status message"


def prefill_sends(source) -> dict[str, Signal]:
    """The completion signals the release's NIXL prefill sends when a transfer succeeds, by name."""
    release = ReleaseFiles(source)
    tree = release.tree(NIXL)
    found: dict[str, Signal] = {}
    # The aux notification's tag, built as f"{req.room}_aux" (0.5.9+) or str(req.room) + "_aux" (0.5.1);
    # the plain tag is preferred to its "_aux_nokv_..." variant (sent when the decode cached every page).
    builders = []
    for node in ast.walk(tree):
        parts = node.values if isinstance(node, ast.JoinedStr) else [node.right] if (
            isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)) else []
        texts = [part.value for part in parts if isinstance(part, ast.Constant) and isinstance(part.value, str)]
        if any(text.startswith("_aux") for text in texts):
            builders.append((texts[-1] != "_aux", node.lineno))
    if builders:
        found[AUX_NOTIFICATION] = Signal(AUX_NOTIFICATION, f"{NIXL}:{min(builders)[1]}")
    # A status push with KVPoll.Success from the NIXL code (its transfer worker). Only nixl/conn.py:
    # common/conn.py's sender sends Success only under the prefill_complete allocation policy.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in STATUS_SENDERS and any(
                _is_kvpoll_success(value) for value in [*node.args, *(k.value for k in node.keywords)]):
            name = _status_name(release)
            found[name] = Signal(name, f"{NIXL}:{node.lineno}")
            break
    return found


def _enclosing_condition(init: ast.FunctionDef, call: ast.Call) -> str | None:
    """The condition (other than the disaggregation mode) under which ``call`` runs in ``init``."""
    parents = {child: parent for parent in ast.walk(init) for child in ast.iter_child_nodes(parent)}
    node: ast.AST = call
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "disaggregation_mode" not in ast.unparse(node.test):
            return ast.unparse(node.test)
    return None


def _listener(release: ReleaseFiles) -> tuple[ast.FunctionDef | None, str]:
    """The release's NIXL decode listener (``_start_decode_listener_thread``) and why it may not run:
    "" when ``NixlKVManager.__init__`` starts it unconditionally in its decode branch (0.5.20+), the
    condition when it starts it only under one (0.5.19: staging or deferred KV release), or a reason
    when there is none (up to 0.5.18 the decode's PULL socket has no reader by default)."""
    listener = _method(release, NIXL, "NixlKVManager", "_start_decode_listener_thread")
    init = _method(release, NIXL, "NixlKVManager", "__init__")
    starts = _calls(init, "_start_decode_listener_thread") if init is not None else []
    if listener is None or not starts:
        return None, "its NixlKVManager starts no listener on the decode's PULL socket"
    conditions = [_enclosing_condition(init, call) for call in starts]
    if None in conditions:
        return listener, ""
    return listener, f"its NixlKVManager starts the decode listener only when {conditions[0]}"


def decode_completes_on(source) -> dict[str, Signal]:
    """The completion signals the release's NIXL decode completes a request on, by name."""
    release = ReleaseFiles(source)
    found: dict[str, Signal] = {}
    # Notifications: a NIXL receiver's poll asks check_transfer_done (after update_transfer_status).
    for cls in release.tree(NIXL).body:
        if isinstance(cls, ast.ClassDef) and "Receiver" in cls.name:
            poll = _method(release, NIXL, cls.name, "poll")
            done = _calls(poll, "check_transfer_done") if poll is not None else []
            if done:
                found[AUX_NOTIFICATION] = Signal(AUX_NOTIFICATION, f"{NIXL}:{done[0].lineno}",
                                                 f"drained by {cls.name}.poll")
                break
    # The status message: a listener started by default hands it to apply_prefill_status, which
    # has a KVPoll.Success branch (0.5.20-0.5.22 take it beside the notifications; 0.5.23 only it).
    listener, not_running = _listener(release)
    applies = _calls(listener, "apply_prefill_status") if listener is not None else []
    apply = _method(release, COMMON, "CommonKVManager", "apply_prefill_status")
    takes_success = apply is not None and any(
        isinstance(node, ast.Compare) and any(_is_kvpoll_success(c) for c in node.comparators)
        for node in ast.walk(apply))
    if applies and takes_success and not not_running:
        name = _status_name(release)
        found[name] = Signal(name, f"{NIXL}:{applies[0].lineno}",
                             "read by its decode listener thread")
    return found


def failure_fate(prefill_source, decode_source) -> str:
    """What the decode does with the status message the prefill sends when a transfer FAILS
    (``conclude_failure``, 0.5.20+): a decode that does not read it learns of the failure only at
    its waiting timeout. Recorded, not refused: requests still serve while transfers succeed."""
    return failure_report(prefill_source, decode_source)[0]


def failure_report(prefill_source, decode_source) -> tuple[str, bool]:
    """:func:`failure_fate`'s text, and whether the decode's listener takes the prefill's failure status."""
    prefill, decode = ReleaseFiles(prefill_source), ReleaseFiles(decode_source)
    # conclude_failure, or a status push whose arguments are not KVPoll.Success.
    senders = [node for node in ast.walk(prefill.tree(NIXL)) if isinstance(node, ast.Call) and (
        _called_name(node) == "conclude_failure" or _called_name(node) in STATUS_SENDERS and not any(
            _is_kvpoll_success(value) for value in [*node.args, *(k.value for k in node.keywords)]))]
    if not senders:
        return (f"the {prefill_source.version} prefill sends no status message on a failed transfer: the decode "
                "learns of it at its waiting timeout"), False
    name = _status_name(prefill)
    sent = f"the {prefill_source.version} prefill's {name} on a failed transfer ({NIXL}:{senders[0].lineno})"
    listener, not_running = _listener(decode)
    if not_running:
        return (f"{sent} is unread ({not_running}): the {decode_source.version} decode learns of it at its "
                "waiting timeout"), False
    parses = _calls(listener, "parse_kv_status_message")
    if parses and _status_name(decode) == name:
        return f"{sent} is taken by the {decode_source.version} decode's listener ({NIXL}:{parses[0].lineno})", True
    return (f"{sent} is dropped by the {decode_source.version} decode's listener ({NIXL}:{listener.lineno}, "
            "'unexpected message tag'): the decode learns of it at its waiting timeout"), False


@dataclass(frozen=True)
class PairSignals:
    """What one prefill release sends when a transfer succeeds and what one decode release
    completes on, read once (each reading parses the release's nixl/conn.py)."""

    prefill: str
    decode: str
    sent: dict[str, Signal]
    awaited: dict[str, Signal]

    @property
    def shared(self) -> list[str]:
        """The completion signals the prefill sends and the decode completes on, by name."""
        return [name for name in self.awaited if name in self.sent]

    @property
    def path(self) -> str:
        """The signal this pair's transfers complete on, for the record ("" when there is none)."""
        return "; ".join(f"{name}: sent at prefill {self.sent[name].where}, taken at decode {self.awaited[name].where}"
                         for name in self.shared)

    @property
    def missing(self) -> str:
        """Why no transfer of this pair can complete ("" when the decode completes on a signal the prefill sends)."""
        if self.shared:
            return ""
        if not self.awaited:
            return (f"the {self.decode} decode completes a transfer on neither the NIXL notification "
                    f"{{room}}_aux nor a status message (read from its {NIXL} and {COMMON})")
        only = " or ".join(f"the prefill's {s.describe()}" for s in self.awaited.values())
        sends = " and ".join(s.describe() for s in self.sent.values()) or "nothing the decode could read"
        return (f"the {self.decode} decode completes a transfer only on {only}, which sglang "
                f"{self.prefill}'s prefill never sends (it ends a transfer with {sends}): every "
                f"request would wait in KVPoll.WaitingForInput until the decode's waiting timeout")


def pair_signals(prefill_source, decode_source) -> PairSignals:
    """Both releases' completion signals, read from their code once."""
    return PairSignals(prefill_source.version, decode_source.version, prefill_sends(prefill_source),
                       decode_completes_on(decode_source))


def missing_completion(prefill_source, decode_source) -> str:
    """Why no transfer of this pair can complete ("" when the decode completes on a signal the prefill sends)."""
    return pair_signals(prefill_source, decode_source).missing


def shared_signals(prefill_source, decode_source) -> list[str]:
    """The completion signals the prefill sends and the decode completes on, by name."""
    return pair_signals(prefill_source, decode_source).shared


def completion_path(prefill_source, decode_source) -> str:
    """The signal this pair's transfers complete on, for the record ("" when there is none)."""
    return pair_signals(prefill_source, decode_source).path
