"""The one place where the CLI turns outcomes and exceptions into exit statuses.

Every sub-command ends in one of three ways, and all three pass through here:

* it reaches an answer and calls :func:`conclude` (one JSON document with ``status``
  and ``exit`` under ``--json``, else its human rendering), then exits with the status;
* it raises a :class:`~forensics.exitcodes.ForensicsError` (or click raises a usage
  error): :func:`run` prints one line on stderr and, under ``--json``, one document
  with ``error`` and ``kind`` added;
* anything else escapes: a bug. The traceback is saved under the cache directory's
  ``crash/`` folder, stderr gets one line naming that file, and the status is 5.

With ``--json`` stdout always holds exactly one document, whichever way it ended.
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import click

from forensics.exitcodes import INTERRUPTED, ExitStatus, ForensicsError, status_word

# emitted: whether this command printed its one --json document (or its first JSON line);
# lines: whether it is a JSON Lines command (watch), whose last line must carry its real status.
_state = {"emitted": False, "lines": False}


def wants_json(argv: list[str]) -> bool:
    """Whether ``--json`` was asked for (options end at ``--``)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def document(status: int, word: str | None = None, **fields) -> dict:
    """A JSON document with the contract's top-level fields first."""
    if word is None:
        word = status_word(status) if 0 <= int(status) <= 5 else "error"
    return {"status": word, "exit": int(status), **fields}


def emit(doc: dict) -> None:
    """Print the one JSON document of this command on stdout."""
    from forensics.cli.render import encode_json

    if "status" not in doc or "exit" not in doc:
        raise ValueError("a --json document needs 'status' and 'exit'")  # a bug in the command
    if _state["emitted"]:
        raise RuntimeError("a second --json document in one command")  # a bug in the command
    doc = {**doc, **_probes_left_open()}
    data = encode_json(doc)
    _state["emitted"] = True
    sys.stdout.buffer.write(data + b"\n") if hasattr(sys.stdout, "buffer") else sys.stdout.write(
        data.decode() + "\n")
    sys.stdout.flush()


def _probes_left_open() -> dict:
    """``probes_left_open``: the probes this command leaves open at its exit (none: no field)."""
    handover = sys.modules.get("forensics.probes.handover")  # no probe was ever sent without it
    if handover is None:
        return {}
    try:
        described = handover.describe_open()
    except Exception:  # noqa: BLE001 - the document must still be printed
        return {}
    return {"probes_left_open": described} if described else {}


def emit_line(doc: dict) -> None:
    """One JSON line of a streaming command (``watch --json``): the lines stand for its document.

    The last line of such a command is always ``"final": true`` with the command's own
    ``status`` and ``exit`` (:func:`conclude_lines`, or the error paths of :func:`run`).
    """
    from forensics.cli.render import encode_json

    if "status" not in doc or "exit" not in doc:
        raise ValueError("a --json line needs 'status' and 'exit'")  # a bug in the command
    data = encode_json(doc, indent=0)  # JSON Lines: one document per line
    _state["emitted"] = True
    _state["lines"] = True
    sys.stdout.buffer.write(data + b"\n") if hasattr(sys.stdout, "buffer") else sys.stdout.write(
        data.decode() + "\n")
    sys.stdout.flush()


def conclude(as_json: bool, status: int, doc: dict, human: Callable[[], None] | None = None,
             word: str | None = None) -> NoReturn:
    """End a command with its answer: the document (JSON) or the human rendering, then the status."""
    status = int(status) if int(status) == INTERRUPTED else ExitStatus(int(status))
    if as_json:
        emit(document(status, word, **doc))
    elif human is not None:
        human()
    sys.exit(int(status))


def conclude_lines(as_json: bool, status: int, doc: dict, word: str | None = None) -> NoReturn:
    """End a JSON Lines command: under ``--json`` one last line, ``"final": true``, with the status it exits with."""
    status = ExitStatus(int(status))
    if as_json:
        emit_line(document(status, word, final=True, **doc))
    sys.exit(int(status))


def fail_after_output(as_json: bool, problem: ForensicsError, doc: dict | None,
                      human: Callable[[], None] | None = None) -> NoReturn:
    """End with ``problem``'s status but keep what was already computed (printed or in the document)."""
    line = _one_line(problem)
    if as_json:
        emit(document(problem.exit_status, problem.word, **(doc or {}), error=line, kind=type(problem).__name__))
    else:
        if human is not None:
            human()
    click.echo(f"forensics: {line}", err=True)
    sys.exit(int(problem.exit_status))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())  # one line whatever the message held


def crash_dir() -> Path:
    """The folder crash files go to, 0700: a traceback quotes command lines and local values."""
    from forensics.private_files import make_private_dir

    try:
        from forensics.cache import cache_dir

        return make_private_dir(cache_dir() / "crash", claim=True)
    except OSError:
        return make_private_dir(Path(tempfile.gettempdir()) / f"pd-forensics-crash-{os.getuid()}", claim=True)


def save_crash(exc: BaseException, argv: list[str]) -> Path | None:
    """Write the traceback (and the command line, redacted) where the user can send it, 0600; None if even that fails."""
    from forensics.private_files import write_private
    from forensics.redact import redact_argv, redact_text

    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    try:
        path = crash_dir() / f"{stamp}-{os.getpid()}.txt"
        text = "forensics " + " ".join(redact_argv(argv)) + "\n\n" + redact_text("".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)))
        write_private(path, text.encode("utf-8"))
        return path
    except OSError:
        return None


def _finish_error(as_json: bool, status: int, word: str, line: str, kind: str) -> NoReturn:
    if as_json and _state["lines"]:
        try:  # a JSON Lines command: its last line says how it really ended
            emit_line(document(status, word, final=True, error=line, kind=kind))
        except Exception:  # noqa: BLE001 - the status below must still be right
            pass
    elif as_json and not _state["emitted"]:
        try:
            emit(document(status, word, error=line, kind=kind))
        except Exception:  # noqa: BLE001 - the status below must still be right
            pass
    sys.exit(int(status))


# The commands that send probes: a SIGTERM ends them through the interpreter's exit (so an open
# probe is handed to a keeper, never closed by the OS), and they first say which probes an
# earlier command left open.
PROBING_COMMANDS = ("collect", "diagnose", "watch", "storm", "validate", "demo")
TERMINATED = 128 + 15


class Terminated(SystemExit):
    """A SIGTERM, ended like an interrupt: through the exit (atexit hooks run), its status 143."""


def _terminate(signum, frame) -> NoReturn:
    raise Terminated(TERMINATED)


def _prepare_probing(args: list[str]) -> None:
    import signal

    command = next((a for a in args if not a.startswith("-")), None)
    if command not in PROBING_COMMANDS:
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        from forensics.probes import handover

        handover.report_held(sys.stderr)
    except OSError:
        pass  # an unreadable cache directory must not stop the command; the hand-over says so at exit


def run(group: click.Group, argv: list[str] | None = None) -> NoReturn:
    """Run the click group and map every way it can end to the exit contract."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(args)
    _state["emitted"] = False
    _state["lines"] = False
    if argv is None:  # a real command line (not a test calling in-process): it owns the process's signals
        _prepare_probing(args)
    try:
        returned = group.main(args=args, prog_name="forensics", standalone_mode=False)
    except Terminated:
        click.echo("forensics: terminated (SIGTERM)", err=True)
        _finish_error(as_json, TERMINATED, "interrupted", "terminated (SIGTERM)", "SIGTERM")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else ExitStatus.INTERNAL)
        if as_json and not _state["emitted"]:
            # A command ended without its document: still give the one document the contract promises.
            emit(document(code))
        sys.exit(code)
    except click.UsageError as exc:
        exc.show()
        _finish_error(as_json, ExitStatus.USAGE, "usage", exc.format_message(), type(exc).__name__)
    except click.FileError as exc:
        line = f"{exc.ui_filename}: {exc.message}"
        click.echo(f"forensics: {line}", err=True)
        _finish_error(as_json, ExitStatus.ENVIRONMENT, "error", line, type(exc).__name__)
    except click.ClickException as exc:
        exc.show()
        _finish_error(as_json, ExitStatus.USAGE, "usage", exc.format_message(), type(exc).__name__)
    except click.exceptions.Abort:
        click.echo("forensics: interrupted", err=True)
        _finish_error(as_json, INTERRUPTED, "interrupted", "interrupted", "KeyboardInterrupt")
    except ForensicsError as exc:
        line = _one_line(exc)
        click.echo(f"forensics: {line}", err=True)
        _finish_error(as_json, exc.exit_status, exc.word, line, type(exc).__name__)
    except BrokenPipeError:
        # stdout went away (``| head``): nothing more can be said there.
        _quiet_stdout()
        sys.exit(int(ExitStatus.ENVIRONMENT))
    except OSError as exc:
        if exc.filename is None or exc.errno == errno.EPIPE:
            _crash(exc, args, as_json)
        line = f"{exc.filename}: {exc.strerror or exc}"
        click.echo(f"forensics: {line}", err=True)
        _finish_error(as_json, ExitStatus.ENVIRONMENT, "error", line, type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - the one place a bug becomes status 5
        _crash(exc, args, as_json)
    # click returns the command's return value (or an Exit's code, e.g. after --help).
    sys.exit(returned if isinstance(returned, int) else 0)


def _crash(exc: BaseException, args: list[str], as_json: bool) -> NoReturn:
    saved = save_crash(exc, args)
    where = f"traceback saved to {saved}" if saved else "the traceback could not be saved"
    line = f"internal error ({type(exc).__name__}: {_one_line(exc)[:200]}); {where}"
    click.echo(f"forensics: {line}", err=True)
    _finish_error(as_json, ExitStatus.INTERNAL, "error", line, type(exc).__name__)


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
