"""The one exception the sandbox raises: a release's code could not be set up here."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox could not load or drive a release; the message names the missing piece.

    Callers (``forensics patch verify``, the handler map) turn it into INCONCLUSIVE: it
    says nothing about how the release behaves, only that this sandbox could not run it.
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
