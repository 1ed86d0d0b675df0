"""What the sandbox watches: thread deaths (``threading.excepthook``) and sglang's log records.

Thread exceptions are recorded with the thread's name, the exception and its traceback
(file and line of every frame), then handed to the previous hook, so CPython still
prints ``Exception in thread Thread-N (bootstrap_thread):`` on stderr exactly as a real
scheduler process would. Exceptions raised after teardown began (the ZMQ context is
terminated on purpose to end the blocked loop) are marked ``during_teardown`` and not
printed: they are the sandbox stopping, not the engine dying.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable


class ThreadWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[dict] = []
        self.teardown_at: float | None = None
        self._previous: Callable | None = None
        self._listeners: list[Callable[[dict], None]] = []
        self._describe: Callable[[threading.Thread | None, dict], dict] | None = None

    def install(self, describe: Callable[[threading.Thread | None, dict], dict] | None = None) -> None:
        """Chain into ``threading.excepthook``; ``describe(thread, record)`` adds fields to each record."""
        self._describe = describe
        if self._previous is None:
            self._previous = threading.excepthook
            threading.excepthook = self._hook

    def uninstall(self) -> None:
        if self._previous is not None and threading.excepthook == self._hook:
            threading.excepthook = self._previous
        self._previous = None

    def on_exception(self, listener: Callable[[dict], None]) -> None:
        self._listeners.append(listener)

    def begin_teardown(self) -> None:
        with self._lock:
            if self.teardown_at is None:
                self.teardown_at = time.time()

    def _hook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        frames = traceback.extract_tb(args.exc_traceback)
        record = {
            "thread": args.thread.name if args.thread is not None else None,
            "thread_ident": args.thread.ident if args.thread is not None else None,
            "exc_type": args.exc_type.__name__,
            "exc_module": args.exc_type.__module__,
            "message": str(args.exc_value),
            "traceback": "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)),
            "frames": [{"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line} for f in frames],
            "file": frames[-1].filename if frames else None,
            "line": frames[-1].lineno if frames else None,
            "time": time.time(),
            "during_teardown": self.teardown_at is not None,
        }
        if self._describe is not None:
            record.update(self._describe(args.thread, record))
        with self._lock:
            self.records.append(record)
        for listener in self._listeners:
            listener(record)
        if not record["during_teardown"] and self._previous is not None:
            self._previous(args)


def _release_source(pathname: str, lineno: int) -> str:
    """``sglang/srt/disaggregation/common/conn.py:872``: the record's line in the release, from its
    package root on (the cache directory in front says nothing)."""
    path = pathname.replace("\\", "/")
    start = path.rfind("sglang/srt/")
    return f"{path[start:] if start >= 0 else path}:{lineno}"


class LogCapture(logging.Handler):
    """Keeps every record of the ``sglang`` loggers (level, logger, message, time, thread)."""

    def __init__(self, watch: ThreadWatch) -> None:
        super().__init__(level=logging.DEBUG)
        self.watch = watch
        self.records: list[dict] = []
        self._records_lock = threading.Lock()
        # Threads of the engine's bootstrap loop: their records are the prefill's; the others
        # come from the sandbox's decode side (frame building) in the same process.
        self.loop_threads: list[threading.Thread] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception as exc:  # a broken format string in sglang is itself worth seeing
            message = f"<unformattable log record {record.msg!r}: {exc}>"
        entry = {
            "level": record.levelname,
            "logger": record.name,
            "message": message,
            "time": record.created,
            "thread": record.threadName,
            "source": _release_source(record.pathname, record.lineno),
            "bootstrap_thread": threading.current_thread() in self.loop_threads,
            "exc_text": logging.Formatter().formatException(record.exc_info) if record.exc_info else None,
            "during_teardown": self.watch.teardown_at is not None,
        }
        with self._records_lock:
            self.records.append(entry)

    def attach(self, logger_name: str = "sglang", level: int = logging.DEBUG) -> None:
        logger = logging.getLogger(logger_name)
        logger.addHandler(self)
        logger.setLevel(level)

    def detach(self, logger_name: str = "sglang") -> None:
        logging.getLogger(logger_name).removeHandler(self)
