"""Reading a file a user names, safely: a regular file only, and no more than a cap.

A path on the command line can be a FIFO, a device (``/dev/zero`` would be read until memory runs
out), a directory or a file far larger than what it claims to be. The file is opened without
blocking and checked before any read, and at most ``limit + 1`` bytes are read. Each refusal names
the file and says what it is; the caller chooses the exception (an ``InventoryError``, a
``DumpFileError``) so that its exit status stays its own.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path


def read_regular_file(path: Path, limit: int, *, noun: str,
                      error: Callable[[str, bool], Exception]) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    ``noun`` names what the file should be ("inventory file"); ``error(message, unreadable)`` makes
    the exception raised, ``unreadable`` True when the file could not be opened or read at all
    (missing, no permission, a directory), False when it was there but is not such a file.
    """
    article = "an" if noun[:1] in "aeiou" else "a"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise error(f"{path}: no such {noun}", True) from exc
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})", True) from exc
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise error(f"{path}: is a directory, not {article} {noun}", True)
        if not stat.S_ISREG(mode):
            raise error(f"{path}: not a regular file ({_file_kind(mode)}), not {article} {noun}", False)
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read ({exc.strerror})", True) from exc
    if len(data) > limit:
        raise error(f"{path}: larger than {limit / 1048576:g} MiB, too big for {article} {noun}", False)
    return data


def _file_kind(mode: int) -> str:
    for test, word in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a plain file"
