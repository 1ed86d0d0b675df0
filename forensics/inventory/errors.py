"""``InventoryError``: what is wrong with an inventory, and where (file, line, key path)."""

from __future__ import annotations

from forensics.exitcodes import EnvironmentProblem


class InventoryError(EnvironmentProblem):
    """An inventory file is missing, unreadable or invalid.

    The message reads ``FILE:LINE: KEY: what`` (``FILE: KEY: what`` when the problem has no
    line, such as a missing table); ``file``, ``line`` and ``key`` hold the parts.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None, path: str | None = None) -> None:
        super().__init__(message, path=path if path is not None else file)
        self.file = file
        self.line = line
        self.key = key

    @classmethod
    def at(cls, file: object, line: int | None, key: str | None, what: str) -> InventoryError:
        where = f"{file}:{line}" if line is not None else f"{file}"
        text = f"{where}: {key}: {what}" if key else f"{where}: {what}"
        return cls(text, file=str(file), line=line, key=key)
