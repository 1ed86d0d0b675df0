"""Editable copies of a release's disaggregation package, for tests that build forks."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from forensics.sglang_source import fetch


def copy_release_tree(version: str, destination: Path) -> Path:
    """The release's disaggregation package (and version.py) copied where a test may edit it."""
    source = fetch(version)
    target = destination / "sglang" / "srt" / "disaggregation"
    shutil.copytree(source.disaggregation, target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(source.root / "sglang" / "version.py", destination / "sglang" / "version.py")
    # The cache's files are read-only; a test's copy is there to be edited.
    for path in (destination / "sglang").rglob("*"):
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target
