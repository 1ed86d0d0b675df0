"""The evidence bundle: one self-describing folder per collection (docs/bundle.md).

    fx.bundle.write(evidence, "incident-2026-11-30")   # frames/*.parquet + manifest.json
    evidence = fx.bundle.open("incident-2026-11-30")    # the same Evidence back, checked

The manifest (``manifest.json``, written last) names every frame file with its rows,
columns and SHA-256, the gaps (what could not be collected and why), every command run
with its result state, and the window. ``open`` refuses a bundle whose files do not
match their checksums, naming the file.
"""

from __future__ import annotations

from .store import MANIFEST_NAME, SCHEMA, BundleError, check_out, open_bundle, write_bundle

open = open_bundle  # noqa: A001 - fx.bundle.open(DIR) reads like the built-in it mirrors
write = write_bundle

__all__ = ["MANIFEST_NAME", "SCHEMA", "BundleError", "check_out", "open", "open_bundle", "write", "write_bundle"]
