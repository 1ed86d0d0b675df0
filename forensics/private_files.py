"""Files only their owner reads: bundles, reports and crash files are written 0600 in 0700 folders.

What the tool writes can hold a deployment's command lines, settings and log lines (redacted,
but redaction recognises only what it can see): the umask of whoever runs the tool must not
decide who else reads them. Each file is created with its mode (never chmod-ed after the
bytes are in), through a temporary name in the same folder that is removed on any error, so a
failed write never leaves a half file or a 0-byte ``.tmp`` behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

FILE_MODE = 0o600
DIR_MODE = 0o700

__all__ = ["DIR_MODE", "FILE_MODE", "make_private_dir", "private_writer", "write_private"]


def make_private_dir(path: str | os.PathLike[str], *, claim: bool = False) -> Path:
    """Create ``path`` (and missing parents, 0700 too) and return it.

    A folder that already existed keeps its mode (it may be the user's own, such as ``.``)
    unless ``claim``: the tool owns it (an empty bundle folder, its own crash folder).
    """
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=DIR_MODE)
        os.chmod(folder, DIR_MODE)  # mkdir's mode passes through the umask, which may take bits away
    if claim and not missing:
        os.chmod(path, DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(20, "not a directory", str(path))
    return path


def _temp_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def private_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file open for writing at a temporary name; renamed onto ``path`` (0600) when the block ends.

    On any error the temporary file is removed and ``path`` is untouched; the error passes
    through with ``filename`` set to the path being written (pyarrow's own OSErrors carry none).
    """
    path = Path(path)
    temp = _temp_name(path)
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()  # ours by name: an earlier run of this pid died here
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        if isinstance(exc, OSError) and exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def write_private(path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], None]) -> Path:
    """Write ``data`` (bytes, or a function writing to the open file) to ``path`` atomically, mode 0600."""
    path = Path(path)
    with private_writer(path) as handle:
        if callable(data):
            data(handle)
        else:
            handle.write(data)
    return path
