"""Where a key is written: the 1-based line of a key path in a TOML document's text.

``tomllib`` returns plain dicts without positions, so errors found while validating would
only name the key. ``Locator`` scans the (already valid) text once and records, for every
key path, the line where it is first written:

- table headers ``[hosts.bastion]`` -> ``("hosts", "bastion")``;
- the N-th ``[[engine]]`` header -> ``("engine", N)`` (sub-tables ``[engine.logs]`` attach to
  the latest element, as TOML says);
- keys, dotted keys (``logs.unit = ...``) and every prefix of them;
- keys inside inline tables (``logs = { unit = "x" }``) and array elements
  (``command = ["docker", ...]`` -> ``("engine", 0, "logs", "command", 1)``).

``line(path)`` falls back to the nearest enclosing path that was found, so a missing key is
reported at its table's header. The scanner never raises: text it cannot follow only leaves
later keys unlocated (then ``line`` answers from what it has, or ``None``).
"""

from __future__ import annotations

import bisect
import tomllib
from collections.abc import Sequence

KeyPath = tuple[str | int, ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def format_path(path: Sequence[str | int]) -> str:
    """``("engine", 1, "logs", "unit")`` -> ``engine[1].logs.unit``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class Locator:
    """Lines of key paths in one TOML text (see the module docstring)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.index: dict[KeyPath, int] = {}
        self._newlines = [i for i, c in enumerate(text) if c == "\n"]
        self._pos = 0
        try:
            self._document()
        except (IndexError, ValueError, tomllib.TOMLDecodeError):
            pass  # keep what was found so far

    def line(self, path: Sequence[str | int]) -> int | None:
        """The line where ``path`` (or, failing that, its nearest enclosing table) is written."""
        key = tuple(path)
        while key:
            if key in self.index:
                return self.index[key]
            key = key[:-1]
        return None

    def exact(self, path: Sequence[str | int]) -> int | None:
        """The line of ``path`` itself, without falling back."""
        return self.index.get(tuple(path))

    # -- scanning --------------------------------------------------------------------------------

    def _line_at(self, pos: int) -> int:
        return bisect.bisect_left(self._newlines, pos) + 1

    def _record(self, path: KeyPath, pos: int) -> None:
        self.index.setdefault(path, self._line_at(pos))

    def _peek(self, n: int = 1) -> str:
        return self.text[self._pos:self._pos + n]

    def _skip_blank(self, newlines: bool) -> None:
        """Spaces, tabs, comments and (when ``newlines``) line ends."""
        text = self.text
        while self._pos < len(text):
            c = text[self._pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self._pos += 1
            elif c == "#":
                end = text.find("\n", self._pos)
                self._pos = len(text) if end < 0 else end
            else:
                return

    def _document(self) -> None:
        table: KeyPath = ()
        arrays: dict[KeyPath, int] = {}  # resolved [[path]] -> elements seen
        text = self.text
        while True:
            self._skip_blank(newlines=True)
            if self._pos >= len(text):
                return
            start = self._pos
            if text.startswith("[[", self._pos):
                self._pos += 2
                names = self._key()
                self._expect("]]")
                parent = self._resolve(names[:-1], arrays)
                base = (*parent, names[-1])
                count = arrays.get(base, 0)
                arrays[base] = count + 1
                table = (*base, count)
                self._record(base, start)
                self._record(table, start)
            elif text.startswith("[", self._pos):
                self._pos += 1
                names = self._key()
                self._expect("]")
                table = self._resolve(names, arrays)
                self._record(table, start)
            else:
                names = self._key()
                self._expect("=")
                for k in range(1, len(names) + 1):
                    self._record((*table, *names[:k]), start)
                self._value((*table, *names))

    def _resolve(self, names: Sequence[str], arrays: dict[KeyPath, int]) -> KeyPath:
        """A header's names with the current element index after every array-of-tables prefix."""
        path: KeyPath = ()
        for name in names:
            path = (*path, name)
            if path in arrays:
                path = (*path, arrays[path] - 1)
        return path

    def _expect(self, token: str) -> None:
        self._skip_blank(newlines=False)
        if not self.text.startswith(token, self._pos):
            raise ValueError(f"expected {token!r} at offset {self._pos}")
        self._pos += len(token)

    def _key(self) -> list[str]:
        """A possibly dotted, possibly quoted key; stops before ``=`` or ``]``."""
        names = []
        while True:
            self._skip_blank(newlines=False)
            c = self._peek()
            if c == '"':
                start = self._pos
                self._basic_string()
                names.append(tomllib.loads(f"k = {self.text[start:self._pos]}")["k"])
            elif c == "'":
                end = self.text.index("'", self._pos + 1)
                names.append(self.text[self._pos + 1:end])
                self._pos = end + 1
            else:
                start = self._pos
                while self._pos < len(self.text) and self.text[self._pos] in _BARE:
                    self._pos += 1
                if self._pos == start:
                    raise ValueError(f"no key at offset {start}")
                names.append(self.text[start:self._pos])
            self._skip_blank(newlines=False)
            if self._peek() != ".":
                return names
            self._pos += 1

    def _value(self, path: KeyPath) -> None:
        self._skip_blank(newlines=False)
        text = self.text
        if text.startswith('"""', self._pos) or text.startswith("'''", self._pos):
            self._multiline_string(text[self._pos])
        elif self._peek() == '"':
            self._basic_string()
        elif self._peek() == "'":
            self._pos = text.index("'", self._pos + 1) + 1
        elif self._peek() == "{":
            self._pos += 1
            while True:
                self._skip_blank(newlines=True)
                if self._peek() == "}":
                    self._pos += 1
                    return
                if self._peek() == ",":
                    self._pos += 1
                    continue
                start = self._pos
                names = self._key()
                self._expect("=")
                for k in range(1, len(names) + 1):
                    self._record((*path, *names[:k]), start)
                self._value((*path, *names))
        elif self._peek() == "[":
            self._pos += 1
            index = 0
            while True:
                self._skip_blank(newlines=True)
                if self._peek() == "]":
                    self._pos += 1
                    return
                if self._peek() == ",":
                    self._pos += 1
                    continue
                self._record((*path, index), self._pos)
                self._value((*path, index))
                index += 1
        else:  # number, bool, date: up to the next delimiter
            while self._pos < len(text) and text[self._pos] not in ",]}\n#":
                self._pos += 1

    def _basic_string(self) -> None:
        text = self.text
        i = self._pos + 1
        while text[i] != '"':
            i += 2 if text[i] == "\\" else 1
        self._pos = i + 1

    def _multiline_string(self, quote: str) -> None:
        text = self.text
        delim = quote * 3
        i = self._pos + 3
        while not text.startswith(delim, i):
            i += 2 if quote == '"' and text[i] == "\\" else 1
        i += 3
        extra = 0
        while extra < 2 and i < len(text) and text[i] == quote:  # """a"""" ends with one quote of content
            i += 1
            extra += 1
        self._pos = i
