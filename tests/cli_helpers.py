"""Run the ``forensics`` CLI inside the test process (fast enough for property tests)."""

from __future__ import annotations

import io
import os
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
