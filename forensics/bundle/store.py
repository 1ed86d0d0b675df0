"""Writing and reading a bundle: Parquet frames plus a manifest with checksums."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from forensics import __version__
from forensics.evidence import FRAMES, Evidence, Gap
from forensics.exitcodes import EnvironmentProblem

SCHEMA = "pd-forensics-bundle/1"
MANIFEST_NAME = "manifest.json"
FRAMES_DIR = "frames"


class BundleError(EnvironmentProblem):
    """A bundle folder is missing, incomplete or altered; the message names the file."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_columns(frame: pd.DataFrame) -> list[str]:
    """Object columns holding anything but text (dicts, lists, mixed): stored as JSON text."""
    out = []
    for column in frame.columns:
        if frame[column].dtype != object:
            continue
        values = frame[column].dropna()
        if len(values) and not all(isinstance(v, str) for v in values):
            out.append(column)
    return out


def _encode(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return json.dumps(value, default=str, sort_keys=True)


def _write_frame(frame: pd.DataFrame, path: Path) -> dict[str, Any]:
    frame = frame.reset_index(drop=True)
    json_columns = _json_columns(frame)
    stored = frame.copy()
    for column in json_columns:
        stored[column] = stored[column].map(_encode).astype("string")
    tmp = path.with_name(path.name + ".tmp")
    stored.to_parquet(tmp, engine="pyarrow", index=False)
    os.replace(tmp, path)
    return {
        "file": f"{FRAMES_DIR}/{path.name}",
        "rows": len(frame),
        "columns": {str(c): str(frame[c].dtype) for c in frame.columns},
        "json_columns": json_columns,
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
    }


def write_bundle(evidence: Evidence, out: str | os.PathLike[str], *, status: str | None = None,
                 exit_code: int | None = None) -> Path:
    """Write ``evidence`` into the folder ``out`` (created; must be empty or absent).

    Frames go first, the manifest last: a folder without ``manifest.json`` is a collection
    that did not finish, and ``open`` says so.

    Example: ``fx.bundle.write(fx.collect("inventory.toml", since="30m"), "incident-2026-11-30")``
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out}: exists and is not an empty folder (a bundle is never written over another)")
    (out / FRAMES_DIR).mkdir(parents=True, exist_ok=True)
    pieces: dict[str, Any] = {}
    for name in FRAMES:
        frame = evidence.frames.get(name)
        if frame is None:
            continue
        pieces[name] = _write_frame(frame, out / FRAMES_DIR / f"{name}.parquet")
    manifest = {
        "schema": SCHEMA,
        "status": status,
        "exit": exit_code,
        "tool": {"name": "pd-forensics", "version": __version__},
        "created": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "collected_at": evidence.collected_at,
        "deployment": evidence.deployment,
        "window": evidence.window,
        "frames": pieces,
        "missing_frames": [name for name in FRAMES if name not in pieces],
        "gaps": [gap.to_dict() for gap in evidence.gaps],
        "commands": evidence.commands,
    }
    tmp = out / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, out / MANIFEST_NAME)
    return out


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise BundleError(f"{folder}: no such bundle folder")
    if not path.is_file():
        partial = sorted(p.name for p in (folder / FRAMES_DIR).glob("*.parquet")) if (folder / FRAMES_DIR).is_dir() else []
        hint = f" (it holds {len(partial)} frame file(s): the collection did not finish)" if partial else ""
        raise BundleError(f"{path}: missing; not a bundle{hint}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        found = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"{path}: schema {found!r}, expected {SCHEMA!r}")
    return manifest


def _decode(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    return json.loads(value)


def open_bundle(folder: str | os.PathLike[str], *, verify: bool = True) -> Evidence:
    """Read a bundle back as :class:`Evidence`; every file is checked against its SHA-256.

    Example: ``fx.bundle.open("incident-2026-11-30").frame("events")``
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    frames: dict[str, pd.DataFrame] = {}
    for name, entry in manifest.get("frames", {}).items():
        path = folder / entry["file"]
        if not path.is_file():
            raise BundleError(f"{path}: listed in the manifest but missing")
        if verify and _sha256(path) != entry["sha256"]:
            raise BundleError(f"{path}: checksum mismatch (the file changed after collection)")
        try:
            frame = pd.read_parquet(path, engine="pyarrow")
        except Exception as exc:  # pyarrow raises several unrelated types for a bad file
            raise BundleError(f"{path}: not a readable Parquet file ({exc})") from None
        for column in entry.get("json_columns", []):
            # Built as a plain object Series: pandas' map on a string column would re-infer
            # the decoded lists and dicts into Arrow arrays and structs.
            frame[column] = pd.Series([_decode(v) for v in frame[column].tolist()], index=frame.index, dtype=object)
        frames[name] = frame
    gaps = [Gap(**gap) for gap in manifest.get("gaps", [])]
    return Evidence(deployment=manifest.get("deployment", {}), frames=frames, gaps=gaps,
                    commands=manifest.get("commands", []), window=manifest.get("window", {}),
                    collected_at=manifest.get("collected_at"))
