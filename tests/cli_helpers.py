"""Run the ``forensics`` CLI inside the test process (fast enough for property tests)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from forensics.cli import main


def invoke(*args: str, columns: int | None = None) -> tuple[int, str, str]:
    """``forensics ARGS`` in this process: (exit status, stdout, stderr); ``columns`` sets the terminal width."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    saved = sys.stdout, sys.stderr
    saved_columns = os.environ.get("COLUMNS")
    if columns:
        os.environ["COLUMNS"] = str(columns)
    sys.stdout, sys.stderr = out, err
    try:
        main(list(args))
        status = 0
    except SystemExit as exit_:
        status = exit_.code
    finally:
        sys.stdout, sys.stderr = saved
        if columns:
            if saved_columns is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = saved_columns
    out.flush()
    return status, out.buffer.getvalue().decode("utf-8"), err.getvalue()


def run_forensics(*args: str, env: dict | None = None, timeout: float = 300,
                  drop_env: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python -m forensics ARGS`` in a child process (for kills and exit statuses that must be real)."""
    environment = {k: v for k, v in os.environ.items() if k not in drop_env}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def one_document(stdout: str) -> dict:
    """The one JSON document a ``--json`` command printed (nothing may follow it)."""
    import json

    document, end = json.JSONDecoder().raw_decode(stdout)
    assert stdout[end:].strip() == ""
    return document
