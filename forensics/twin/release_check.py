"""What a twin needs from a release's code to serve its requests, checked before anything starts.

A twin that cannot serve a release must say so up front (``twin up`` exits 4 naming what is
missing), never start and let every request wait. Everything here is read from the release's own
files (static: ``ast`` on the cached, checksummed sources), so a new release, or a fork, is
judged by its code, not by a version list:

* (not the failure type: the twin names failures with ``common/conn.py``'s ``KVTransferError``
  where the release has one, and as the release's own exceptions say otherwise, as sglang does;)
* the KV arguments: every field the release's ``KVArgs`` declares without a default must be one
  the twin fills (:func:`forensics.sandbox.host_memory.kv_args_for`), as the release's scheduler
  fills it in ``_init_kv_manager`` (0.5.17 added ``kv_layer_ids`` and ``state_layer_ids``, which
  the decode's KV-args registration packs);
* the receiver's methods the twin's decode calls (``poll``, ``failure_exception``, and
  ``send_metadata`` or, up to 0.5.9, ``init`` for the transfer info), defined by the release's
  receiver classes;
* how the decode learns that a transfer ended: NIXL notifications tallied in a ``TransferStatus``
  (to 0.5.22), or the prefill's ``KV_STATUS`` message read by the decode listener thread that
  ``NixlKVManager.__init__`` starts (0.5.23; the twin runs that thread with the release's own
  statements). A release with neither would leave every decode request waiting.
"""

from __future__ import annotations

import ast
from pathlib import Path

# Methods of the release's receiver that the twin's decode calls (forensics.twin.decode).
# (``clear`` too, but the decode tolerates its absence: it differs per release and the room is done.)
RECEIVER_METHODS = ("poll", "failure_exception")
# ... and one way to send the transfer info: ``send_metadata`` (0.5.10+), or ``init`` (up to 0.5.9,
# whose receiver bootstraps and registers in its own ``__init__``). ``abort`` is called only where
# the release has one, as its scheduler does.
TRANSFER_INFO_METHODS = ("send_metadata", "init")


def twin_kv_args_fields() -> set[str]:
    """The KVArgs fields the twin fills (both sides use :func:`kv_args_for`; the NIXL memory kinds
    are set after it, by the sandbox's manager state)."""
    from forensics.sandbox.host_memory import kv_args_for

    class _Fields:
        pass

    filled = kv_args_for(_Fields, kv_data_ptrs=[], kv_data_lens=[], kv_item_lens=[], aux_data_ptrs=[],
                         aux_data_lens=[], aux_item_lens=[])
    return set(vars(filled)) | {"kv_data_mem_kinds"}


class ReleaseFiles:
    """The parsed disaggregation files of one release (absent files read as empty)."""

    def __init__(self, source) -> None:
        self.source = source
        self.root = Path(source.root) / "sglang/srt/disaggregation"
        self._trees: dict[str, ast.Module] = {}

    def tree(self, relative: str) -> ast.Module:
        if relative not in self._trees:
            path = self.root / relative
            text = ""
            if path.is_file():
                verified = getattr(self.source, "verified_read_text", None)  # the cache checks what is read
                text = verified(path) if verified else path.read_text(encoding="utf-8", errors="replace")
            self._trees[relative] = ast.parse(text)
        return self._trees[relative]

    def class_def(self, relative: str, name: str) -> ast.ClassDef | None:
        return next((node for node in self.tree(relative).body
                     if isinstance(node, ast.ClassDef) and node.name == name), None)

    def methods(self, relative: str, name: str) -> set[str]:
        cls = self.class_def(relative, name)
        if cls is None:
            return set()
        return {node.name for node in cls.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}

    def class_attributes(self, relative: str, name: str) -> set[str]:
        cls = self.class_def(relative, name)
        if cls is None:
            return set()
        found = set()
        for node in cls.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
        return found


def missing_for_twin(source) -> list[str]:
    """What the twin would need from ``source`` (an :class:`~forensics.sglang_source.Source`-like
    object with ``root`` and ``version``) and does not find; empty when the twin can serve it."""
    release = ReleaseFiles(source)
    missing: list[str] = []
    kv_args = release.class_def("base/conn.py", "KVArgs")
    if kv_args is None:
        missing.append("base/conn.py defines no KVArgs")
    else:
        filled = twin_kv_args_fields()
        unfilled = [f"KVArgs.{node.target.id} (base/conn.py:{node.lineno})" for node in kv_args.body
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.value is None and node.target.id not in filled]
        if unfilled:
            missing.append(f"the release's KVArgs declares {', '.join(unfilled)} without a default, which its "
                           "scheduler fills and the twin's KV arguments (sandbox.host_memory.kv_args_for) do not")
    # Every receiver class the NIXL receiver may inherit from (older releases keep some methods in
    # base or common classes under other names).
    receiver = set().union(*(release.methods(relative, node.name) for relative in ("nixl/conn.py", "common/conn.py",
                                                                                   "base/conn.py")
                             for node in release.tree(relative).body
                             if isinstance(node, ast.ClassDef) and "Receiver" in node.name))
    absent = [name for name in RECEIVER_METHODS if name not in receiver]
    if not any(name in receiver for name in TRANSFER_INFO_METHODS):
        absent.append(" or ".join(TRANSFER_INFO_METHODS))
    if absent:
        missing.append(f"NixlKVReceiver (nixl/conn.py) and CommonKVReceiver (common/conn.py) define no "
                       f"{', '.join(absent)}, which the twin's decode calls")
    notified = any(release.class_def(name, "TransferStatus") is not None for name in ("nixl/conn.py", "common/conn.py"))
    manager = release.methods("nixl/conn.py", "NixlKVManager")
    kv_status = ("kv_status_msg_tag" in release.class_attributes("nixl/conn.py", "NixlKVManager")
                 and "_start_decode_listener_thread" in manager
                 and "apply_prefill_status" in release.methods("common/conn.py", "CommonKVManager"))
    if not notified and not kv_status:
        missing.append("the decode learns a transfer's end neither from NIXL notifications (no TransferStatus in "
                       "nixl/conn.py or common/conn.py) nor from the prefill's KV_STATUS (NixlKVManager has no "
                       "kv_status_msg_tag and _start_decode_listener_thread, or CommonKVManager no "
                       "apply_prefill_status)")
    return missing
