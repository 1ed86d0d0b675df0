"""The three roles of a real-engine deployment: their command lines, start under a lifeline, readiness.

Each role's command line is derived from the inventory's ``[twin]`` table alone
(:class:`~forensics.inventory.twin_table.TwinSettings` with ``engine = "sglang"``), so ``twin restart``
starts a role exactly as ``twin up`` did: same interpreter (the deployment's clone), model,
ports and environment. The prefill and decode are ``sglang.launch_server`` (:mod:`launch`), the
router is sglang-router's mini load balancer.

Readiness is polled for all the roles at once, each against its own deadline counted from its
start: ``/health`` answering 200 (the servers' ``/health`` runs a generation; the mini LB's
answers as soon as it listens). A role that exits first is reported with its log's last lines.

Test hook (tests only, documented in docs/engine.md): ``FORENSICS_ENGINE_EXTRA_ARGS`` holds a JSON
object ``{"role": ["--flag", ...]}`` whose flags are appended to that role's command line (a
bad flag makes an engine crash during start-up, as a real misconfiguration does).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from forensics.engine import launch, records
from forensics.engine.lifeline import HeldProcess, start_held
from forensics.exitcodes import UsageProblem
from forensics.inventory.twin_table import TwinSettings

ROLE_ORDER = ("prefill", "decode", "router")
EXTRA_ARGS_ENV = "FORENSICS_ENGINE_EXTRA_ARGS"
WAITING_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
READY_TIMEOUT_S = 600.0  # ~25-60 s alone; minutes on 2 cores shared with other engines


class EngineEnvironmentView:
    """What :mod:`launch` needs of an engine environment, for the deployment's clone."""

    def __init__(self, root: str, version: str) -> None:
        self.root = Path(root)
        self.version = version  # the release: launch adds the flags it needs (0.5.16's prefill)
        self.python = self.root / "venv" / "bin" / "python"


def extra_args(role: str) -> tuple[str, ...]:
    """The test hook's flags for ``role`` (see the module docstring); () when it is not set."""
    text = os.environ.get(EXTRA_ARGS_ENV)
    if not text:
        return ()
    try:
        table = json.loads(text)
        flags = table.get(role, []) if isinstance(table, dict) else None
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise ValueError("expected a JSON object of role -> list of strings")
    except ValueError as exc:
        raise UsageProblem(f"{EXTRA_ARGS_ENV}={text!r}: {exc}") from None
    return tuple(flags)


def role_argv(settings: TwinSettings, role: str) -> list[str]:
    env = EngineEnvironmentView(settings.engine_env, settings.sglang)
    prefill_url, decode_url = settings.url(settings.prefill_port), settings.url(settings.decode_port)
    if role == "router":
        return [*launch.router_argv(env, prefill_url, settings.bootstrap_port, decode_url, settings.router_port),
                *extra_args(role)]
    port = settings.prefill_port if role == "prefill" else settings.decode_port
    return launch.server_argv(env, Path(settings.model), role, port, backend=settings.backend,
                              bootstrap_port=settings.bootstrap_port if role == "prefill" else None,
                              extra_args=extra_args(role))


def role_environment(settings: TwinSettings, role: str) -> dict[str, str]:
    extra = {"PYTHONUNBUFFERED": "1"}
    if role == "decode":  # sglang reads it as an integer (environ.py: EnvInt)
        extra[WAITING_TIMEOUT_ENV] = str(int(settings.waiting_timeout_s))
    env = launch.process_environment(extra)
    # Nothing of this project leaks into the engine: it runs its own environment, as on a real host.
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", EXTRA_ARGS_ENV, "FORENSICS_TWIN_FAULT"):
        env.pop(name, None)
    return env


def url_of(settings: TwinSettings, role: str) -> str:
    return settings.url({"prefill": settings.prefill_port, "decode": settings.decode_port,
                         "router": settings.router_port}[role])


def start_role(settings: TwinSettings, role: str) -> HeldProcess:
    """Start ``role`` under its lifeline, appending to its log; its leader is recorded at once."""
    directory = Path(settings.directory)
    argv = role_argv(settings, role)
    held = start_held(role, EngineEnvironmentView(settings.engine_env, settings.sglang).python, argv,
                      records.log_file(directory, role), role_environment(settings, role))
    records.write_leader(directory, role, held.pid, held.create_time, argv)
    return held


def wait_ready(settings: TwinSettings, held: dict[str, HeldProcess], started: dict[str, float],
               timeouts: dict[str, float] | None = None, on_ready=None) -> dict[str, float]:
    """Seconds from each role's start until ``/health`` answered 200, all polled together.

    Raises :class:`~forensics.engine.launch.EngineStartError` (exit 4) for the first role that
    exits or misses its deadline, quoting its log's last lines. ``on_ready(role)`` is called as
    each role becomes ready (the members are recorded then).
    """
    directory = Path(settings.directory)
    timeouts = timeouts or {}
    waiting = dict(held)
    ready: dict[str, float] = {}
    while waiting:
        for role, process in list(waiting.items()):
            status = process.exited()
            if status is not None:
                raise launch.EngineStartError(
                    f"the {role} (sglang {settings.sglang}) exited with status {status} during start-up: "
                    f"{log_tail(directory, role)}", path=str(records.log_file(directory, role)))
            if _answers(url_of(settings, role) + "/health"):
                ready[role] = round(time.monotonic() - started[role], 3)
                del waiting[role]
                if on_ready is not None:
                    on_ready(role)
                continue
            limit = timeouts.get(role, READY_TIMEOUT_S)
            if time.monotonic() - started[role] > limit:
                raise launch.EngineStartError(
                    f"the {role} at {url_of(settings, role)} did not answer /health within {limit:g} s "
                    f"(it is still running; stopped now): {log_tail(directory, role)}",
                    path=str(records.log_file(directory, role)))
        if waiting:
            time.sleep(0.5)
    return ready


def _answers(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(directory: Path, role: str, lines: int = 6) -> str:
    try:
        text = records.log_file(directory, role).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in text[-lines:]) or "(empty log)"
