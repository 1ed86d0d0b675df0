"""A decode that can block for good when its prefill restarts: read from the decode's release.

The deploy restarts prefill engines. A decode keeps one cached ZMQ PUSH socket per prefill
(``CommonKVReceiver._connect`` in ``disaggregation/common/conn.py``). Where that socket is made
with ``RECONNECT_IVL -1`` and no ``SNDTIMEO`` (sglang 0.5.15 and 0.5.15.post1), it never
connects to the restarted prefill, and a send on it waits forever: the decode's scheduler
stops. Sends happen whenever a request waiting for KV times out or is aborted (its ABORT) or a
new request arrives, until the decode's heartbeat has failed often enough to drop the socket
(``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`` x ``..._MAX_FAILURE``). A wedged engine has many
such requests, so a deploy can trade the prefill's wedge for the decode's.

Decided from the decode's own release source (never a version list): the socket options set in
``CommonKVReceiver._connect``. The remedy the deploy offers is to restart those decodes after
the prefills (``restart_decodes=True``): a fresh decode has no cached socket.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

CONN = "sglang/srt/disaggregation/common/conn.py"
RECEIVER_CLASS = "CommonKVReceiver"


@dataclass(frozen=True)
class DecodeHazard:
    """One decode engine whose release blocks on a send to a restarted prefill."""

    engine: str
    label: str
    host: str
    release: str
    where: str  # "common/conn.py:1101 CommonKVReceiver._connect"
    restart: list[str] | None  # the decode's restart line, when the inventory has one

    def describe(self) -> str:
        return (f"{self.label} runs sglang {self.release}, whose decode blocks for good on a send to a restarted "
                f"prefill ({self.where}: RECONNECT_IVL -1 and no SNDTIMEO); a request waiting for KV that times "
                "out or is aborted before its heartbeat drops the old socket stops its scheduler")

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "label": self.label, "host": self.host, "release": self.release, "where": self.where,
                "restart": self.restart}


def _setsockopt_options(function: ast.AST) -> dict[str, ast.expr]:
    """``{option name: value}`` of each ``x.setsockopt(zmq.NAME, value)`` in ``function``."""
    found: dict[str, ast.expr] = {}
    for node in ast.walk(function):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setsockopt"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Attribute)):
            found[node.args[0].attr] = node.args[1]
    return found


def _is_minus_one(value: ast.expr) -> bool:
    try:
        return ast.literal_eval(value) == -1
    except ValueError:
        return False


def blocking_connect(conn_text: str) -> int | None:
    """The line of the receiver's ``_connect`` when its socket never reconnects and has no send
    timeout; None when it reconnects or times out (or the release has no such method)."""
    tree = ast.parse(conn_text)
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == RECEIVER_CLASS):
            continue
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "_connect":
                options = _setsockopt_options(item)
                no_reconnect = "RECONNECT_IVL" in options and _is_minus_one(options["RECONNECT_IVL"])
                if no_reconnect and "SNDTIMEO" not in options:
                    return item.lineno
    return None


def release_blocks(version: str) -> str | None:
    """``"common/conn.py:LINE CommonKVReceiver._connect"`` when sglang ``version``'s decode blocks
    on a send to a restarted prefill; None when it does not. Raises ``SourceError`` when the
    release's source cannot be had."""
    from forensics.sglang_source import fetch

    source = fetch(version)
    path = source.root / CONN
    if not path.is_file():
        return None  # before common/conn.py each backend kept its own sockets (none with RECONNECT_IVL -1)
    line = blocking_connect(source.verified_read_text(path))
    return None if line is None else f"common/conn.py:{line} {RECEIVER_CLASS}._connect"


def decode_hazards(inv, cache: dict[str, Any] | None = None) -> tuple[list[DecodeHazard], list[str]]:
    """Each decode engine of ``inv`` whose release blocks, and what could not be decided (why).

    The decode's release is the engine's own ``sglang`` (an upgrade in progress), else the
    deployment's, else what the decode's own interpreter reports (as the deploy locates a
    prefill's); a decode whose release cannot be had is undecided, named in the second list.
    """
    from forensics.exitcodes import EnvironmentProblem
    from forensics.inventory.model import restart_argv
    from patched_engine.locate import locate

    cache = {} if cache is None else cache
    hazards: list[DecodeHazard] = []
    undecided: list[str] = []
    for engine in inv.engines_with("decode"):
        version = engine.sglang or inv.sglang
        if not version:
            try:
                version = locate(inv.host_for(engine), engine.python, engine.sglang_location,
                                 label=engine.label).version
            except EnvironmentProblem as exc:
                undecided.append(f"{engine.label}: its sglang release is not in the inventory and could not be asked "
                                 f"({exc}), so whether its decode blocks on a restarted prefill (as 0.5.15's does) "
                                 "is not known")
                continue
        if not version:
            undecided.append(f"{engine.label}: its interpreter reports no sglang release, so whether its decode "
                             "blocks on a restarted prefill (as 0.5.15's does) is not known")
            continue
        if version not in cache:
            try:
                cache[version] = release_blocks(version)
            except Exception as exc:  # SourceError and friends: say so, never assume it is safe
                cache[version] = exc
        where = cache[version]
        if isinstance(where, Exception):
            undecided.append(f"{engine.label}: sglang {version}'s source could not be read ({where})")
        elif where:
            hazards.append(DecodeHazard(engine.name, engine.label, str(engine.host), version, where,
                                        restart_argv(engine.restart) if engine.restart else None))
    return hazards, undecided
