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

from forensics.exitcodes import ExitStatus, ForensicsError, status_word

_state = {"emitted": False}  # whether this command printed its one --json document


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
    data = encode_json(doc)
    _state["emitted"] = True
    sys.stdout.buffer.write(data + b"\n") if hasattr(sys.stdout, "buffer") else sys.stdout.write(
        data.decode() + "\n")
    sys.stdout.flush()


def emit_line(doc: dict) -> None:
    """One JSON line of a streaming command (``watch --json``): the lines stand for its document."""
    from forensics.cli.render import encode_json

    if "status" not in doc or "exit" not in doc:
        raise ValueError("a --json line needs 'status' and 'exit'")  # a bug in the command
    data = encode_json(doc, indent=0)  # JSON Lines: one document per line
    _state["emitted"] = True
    sys.stdout.buffer.write(data + b"\n") if hasattr(sys.stdout, "buffer") else sys.stdout.write(
        data.decode() + "\n")
    sys.stdout.flush()


def conclude(as_json: bool, status: int, doc: dict, human: Callable[[], None] | None = None,
             word: str | None = None) -> NoReturn:
    """End a command with its answer: the document (JSON) or the human rendering, then the status."""
    status = ExitStatus(int(status))
    if as_json:
        emit(document(status, word, **doc))
    elif human is not None:
        human()
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
    if as_json and not _state["emitted"]:
        try:
            emit(document(status, word, error=line, kind=kind))
        except Exception:  # noqa: BLE001 - the status below must still be right
            pass
    sys.exit(int(status))


def run(group: click.Group, argv: list[str] | None = None) -> NoReturn:
    """Run the click group and map every way it can end to the exit contract."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(args)
    _state["emitted"] = False
    try:
        returned = group.main(args=args, prog_name="forensics", standalone_mode=False)
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
        _finish_error(as_json, 130, "interrupted", "interrupted", "KeyboardInterrupt")
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
