"""The one exception the sandbox raises: a release's code could not be set up here."""

from __future__ import annotations

from forensics.exitcodes import Undecided


class SandboxError(Undecided, RuntimeError):
    """The sandbox could not load or drive a release; the message names the missing piece.

    INCONCLUSIVE (exit 3) wherever it ends a command, as its callers (``forensics patch
    verify``, the handler map) also read it: it says nothing about how the release behaves, only
    that this sandbox could not run it. A RuntimeError still, for callers that catch those.
    """


class UnexpectedImport(SandboxError):
    """A module outside the release's real/stub lists was imported (the shim never guesses)."""

    def __init__(self, module: str, importer: str | None, version: str) -> None:
        self.module = module
        self.importer = importer
        self.version = version
        by = f" (imported by {importer})" if importer else ""
        super().__init__(
            f"sglang {version}: module {module}{by} is neither loaded for real nor in the sandbox's "
            f"stub list for this release (forensics/sandbox/stubs.py)"
        )
