"""SIGINT and SIGTERM while a deploy or rollback changes a deployment: noted, acted on between steps.

A Ctrl-C that raised ``KeyboardInterrupt`` in the middle of a restart killed the restart
command's process group (the Host stops a command its caller abandons) and left the prefill
dead. Inside :class:`DeferredInterrupts` a signal only sets a flag and prints one line on
stderr; the step that runs (a command, an upload, a restart to its own end, a liveness
attempt) finishes, and the deploy stops at its next :meth:`~DeferredInterrupts.checkpoint`,
raising :class:`Interrupted`, which the deploy turns into a record listing every step done
and the state each engine is left in.

Every signal while a step runs is deferred, the second and the third too: the longest step
is a restart, bounded by its timeout (``restart_timeout_s``). ``kill -9`` remains the hard
stop; it leaves ``conn.py`` original or patched as always, but may cut a restart short.

Handlers can only be installed from the main thread; elsewhere (a notebook's worker
thread) the context changes nothing and signals behave as before.
"""

from __future__ import annotations

import os
import signal
import threading
import time

DEFERRED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):  # noqa: N818 - it names what happened, as KeyboardInterrupt does
    """A deferred signal, acted on at a step boundary (``where``): nothing was cut halfway."""

    def __init__(self, signal_name: str, where: str, received_at: float) -> None:
        super().__init__(f"{signal_name} received; stopped {where}")
        self.signal_name = signal_name
        self.where = where
        self.received_at = received_at


class DeferredInterrupts:
    """Within ``with``: SIGINT/SIGTERM are recorded, never raised; :meth:`checkpoint` raises at a safe point."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.received: list[tuple[str, float]] = []  # (signal name, time.monotonic())
        self._saved: dict[int, object] = {}

    def __enter__(self) -> DeferredInterrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in DEFERRED:
                self._saved[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def _note(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.received.append((name, time.monotonic()))
        # os.write, not print: a handler runs between two bytecodes, maybe inside a write to stderr.
        line = (f"forensics: {name} received: the {self.action} finishes the step it is in (a restart is never "
                "cut halfway), then stops and lists what it did\n")
        try:
            os.write(2, line.encode())
        except OSError:
            pass

    @property
    def requested(self) -> bool:
        return bool(self.received)

    def checkpoint(self, where: str) -> None:
        """Raise :class:`Interrupted` if a signal came; ``where`` says what will not be done."""
        if self.received:
            name, at = self.received[0]
            raise Interrupted(name, where, at)

