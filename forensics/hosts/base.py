"""The one interface every Host offers, and the streaming object its commands return.

``LocalHost`` and ``SSHHost`` (and anything later, like httpx's transports) implement
``_chunks``: a generator that yields stdout chunks as they arrive and *returns* the
``CommandResult``. ``run`` collects it under a byte cap; ``stream`` hands it to the
caller chunk by chunk, so a long output never sits whole in memory.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from .result import CommandResult

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # per stream (stdout, stderr)
DEFAULT_CHUNK = 64 * 1024

Chunks = Generator[bytes, None, CommandResult]


class CappedBuffer:
    """Keeps at most ``limit`` bytes; whatever comes after is counted and dropped (``truncated``)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def add(self, data: bytes) -> None:
        if self.limit is not None and self.kept + len(data) > self.limit:
            data = data[: max(self.limit - self.kept, 0)]
            self.truncated = True
        if data:
            self.parts.append(data)
            self.kept += len(data)

    def value(self) -> bytes:
        return b"".join(self.parts)


class CommandStream:
    """Iterate for stdout chunks (bytes); ``result`` is the ``CommandResult`` once the command ended.

    The result's ``stdout`` is empty (it went to the caller); ``stderr`` is kept up to the
    byte cap. Closing early (``close()``, leaving a ``with`` block, ``break``) stops the command.
    """

    def __init__(self, chunks: Chunks) -> None:
        self._chunks = chunks
        self.result: CommandResult | None = None

    def __iter__(self) -> Iterator[bytes]:
        self.result = yield from self._chunks
        return None

    def close(self) -> None:
        self._chunks.close()

    def __enter__(self) -> CommandStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Host(ABC):
    """Where a command runs. Every command is an argument list; every run returns a ``CommandResult``."""

    name: str

    @abstractmethod
    def _chunks(
        self, argv: Sequence[str], *, timeout: float, sudo: bool, chunk_size: int, max_stderr: int | None
    ) -> Chunks: ...

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        sudo: bool = False,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> CommandResult:
        """Run ``argv`` to its end or its deadline; stdout and stderr each kept up to ``max_bytes``."""
        out = CappedBuffer(max_bytes)
        chunks = self._chunks(argv, timeout=timeout, sudo=sudo, chunk_size=DEFAULT_CHUNK, max_stderr=max_bytes)
        result: CommandResult | None = None
        try:
            while True:
                out.add(next(chunks))
        except StopIteration as stop:
            result = stop.value
        finally:
            chunks.close()
        return replace(result, stdout=out.value(), truncated=result.truncated or out.truncated)

    def stream(
        self,
        argv: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        sudo: bool = False,
        chunk_size: int = DEFAULT_CHUNK,
        max_stderr: int | None = 1024 * 1024,
    ) -> CommandStream:
        """Stdout as an iterator of byte chunks (each at most ``chunk_size``), in bounded memory."""
        return CommandStream(
            self._chunks(argv, timeout=timeout, sudo=sudo, chunk_size=chunk_size, max_stderr=max_stderr)
        )

    @abstractmethod
    def read_file(self, path: str) -> bytes:
        """The whole file (use ``iter_file`` for long ones). A missing file raises ``FileNotFoundError``."""

    @abstractmethod
    def iter_file(self, path: str, chunk_size: int = DEFAULT_CHUNK) -> Iterator[bytes]:
        """The file's bytes in chunks, never whole in memory."""

    @abstractmethod
    def put_file(self, local: str | os.PathLike[str], remote: str) -> None:
        """Copy a local file to ``remote`` on this host."""

    def close(self) -> None:  # noqa: B027 - hosts without a connection have nothing to close
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def as_path(p: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(p))
