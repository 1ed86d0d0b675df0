"""Writing and reading a bundle: Parquet frames plus a manifest with checksums."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from forensics import __version__
from forensics.evidence import FRAMES, Evidence, Gap
from forensics.exitcodes import EnvironmentProblem
from forensics.private_files import make_private_dir, private_writer, write_private

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
    with private_writer(path) as handle:
        stored.to_parquet(handle, engine="pyarrow", index=False)
    return {
        "file": f"{FRAMES_DIR}/{path.name}",
        "rows": len(frame),
        "columns": {str(c): str(frame[c].dtype) for c in frame.columns},
        "json_columns": json_columns,
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
    }


def check_out(out: str | os.PathLike[str]) -> Path:
    """``out`` as a place a bundle may go (absent or an empty folder), else BundleError naming it.

    ``forensics collect`` asks this before it sends a single probe: a collection whose
    bundle cannot be written must not have touched the deployment first.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        held = " (it holds a bundle)" if (out / MANIFEST_NAME).exists() else ""
        raise BundleError(f"{out}: exists and is not an empty folder{held}; a bundle is never written over "
                          "another: give a new --out", path=str(out))
    return out


def write_bundle(evidence: Evidence, out: str | os.PathLike[str], *, status: str | None = None,
                 exit_code: int | None = None) -> Path:
    """Write ``evidence`` into the folder ``out`` (created; must be empty or absent).

    Frames go first, the manifest last: a folder without ``manifest.json`` is a collection
    that did not finish, and ``open`` says so. Files are 0600, folders 0700 (a bundle holds a
    deployment's command lines). A frame that cannot be written (a full disk) does not lose
    the others: they are kept, the manifest lists them and the unwritten ones, and the error
    (exit 4) names the file that failed and where the rest is.

    Example: ``fx.bundle.write(fx.collect("inventory.toml", since="30m"), "incident-2026-11-30")``
    """
    out = check_out(out)
    try:
        make_private_dir(out, claim=True)
        make_private_dir(out / FRAMES_DIR, claim=True)
    except OSError as exc:
        raise BundleError(f"{exc.filename or out}: cannot create the bundle folder ({exc.strerror or exc})",
                          path=str(out)) from None
    pieces: dict[str, Any] = {}
    unwritten: dict[str, str] = {}
    for name in FRAMES:
        frame = evidence.frames.get(name)
        if frame is None:
            continue
        path = out / FRAMES_DIR / f"{name}.parquet"
        try:
            pieces[name] = _write_frame(frame, path)
        except OSError as exc:
            unwritten[name] = f"{exc.filename or path}: {exc.strerror or exc}"
    manifest = {
        "schema": SCHEMA,
        "status": "unwritten" if unwritten else status,
        "exit": int(EnvironmentProblem.exit_status) if unwritten else exit_code,
        "tool": {"name": "pd-forensics", "version": __version__},
        "created": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "collected_at": evidence.collected_at,
        "deployment": evidence.deployment,
        "window": evidence.window,
        "frames": pieces,
        "missing_frames": [name for name in FRAMES if name not in pieces],
        "unwritten_frames": unwritten,
        "gaps": [gap.to_dict() for gap in evidence.gaps],
        "commands": evidence.commands,
    }
    text = json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n"
    try:
        write_private(out / MANIFEST_NAME, text.encode("utf-8"))
    except OSError as exc:
        kept = ", ".join(entry["file"] for entry in pieces.values()) or "none"
        first = f"; first unwritten frame: {next(iter(unwritten.values()))}" if unwritten else ""
        raise BundleError(f"{exc.filename or out / MANIFEST_NAME}: cannot write the manifest ({exc.strerror or exc})"
                          f"{first}; frames kept in {out}: {kept}", path=str(out)) from None
    if unwritten:
        name, reason = next(iter(unwritten.items()))
        raise BundleError(f"{reason}: the {name} frame could not be written ({len(unwritten)} frame(s) unwritten: "
                          f"{', '.join(unwritten)}); {out}/{MANIFEST_NAME} lists the {len(pieces)} frame(s) kept",
                          path=str(out))
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
    if path.is_symlink():
        raise BundleError(f"{path}: a symbolic link; a bundle's manifest is a file of its own")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        found = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"{path}: schema {found!r}, expected {SCHEMA!r}")
    frame_paths(folder, manifest)
    return manifest


def frame_paths(folder: str | os.PathLike[str], manifest: dict[str, Any]) -> dict[str, Path]:
    """Each frame's file, checked to be a plain relative name inside ``folder``, before any is opened.

    A bundle is a closed world: a manifest entry ``frames.NAME.file`` that is absolute, holds
    ``..``, or resolves (through a symbolic link) outside the folder is refused naming the
    manifest and the entry: reading it would hash a file of the machine (telling whether it
    exists) or take another bundle's frame as this one's.
    """
    folder = Path(folder)
    where = folder / MANIFEST_NAME
    frames = manifest.get("frames", {})
    if not isinstance(frames, dict):
        raise BundleError(f"{where}: 'frames' is a {type(frames).__name__}, expected an object of frame entries")
    root = folder.resolve()
    paths: dict[str, Path] = {}
    for name, entry in frames.items():
        key = f"frames.{name}.file"
        file = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(file, str) or not file:
            raise BundleError(f"{where}: {key} is missing or not a string")
        if not isinstance(entry.get("sha256"), str):
            raise BundleError(f"{where}: frames.{name}.sha256 is missing or not a string")
        parts = file.replace("\\", "/").split("/")
        if file.startswith(("/", "\\")) or os.path.isabs(file) or ".." in parts or any(p in ("", ".") for p in parts) \
                or "\x00" in file:
            raise BundleError(f"{where}: {key} {file!r} is not a plain relative name inside the bundle "
                              "(no absolute path, no '..'): refused before opening anything")
        resolved = (folder / file).resolve()
        if not resolved.is_relative_to(root):
            raise BundleError(f"{where}: {key} {file!r} leads outside the bundle (to {resolved}, through a "
                              "symbolic link): refused before opening anything")
        paths[name] = folder / file
    return paths


def _decode(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    return json.loads(value)


def _read_checked(path: Path, sha256: str, verify: bool) -> pd.DataFrame:
    """The frame in ``path``, hashed and parsed from one open file (not a second open another file could take)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise BundleError(f"{path}: listed in the manifest but missing") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot open ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BundleError(f"{path}: not a regular file")
        if verify:
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            if digest.hexdigest() != sha256:
                raise BundleError(f"{path}: checksum mismatch (the file changed after collection)")
            handle.seek(0)
        try:
            return pd.read_parquet(handle, engine="pyarrow")
        except Exception as exc:  # pyarrow raises several unrelated types for a bad file
            raise BundleError(f"{path}: not a readable Parquet file ({exc})") from None


def open_bundle(folder: str | os.PathLike[str], *, verify: bool = True, partial: bool = False) -> Evidence:
    """Read a bundle back as :class:`Evidence`; every file is checked against its SHA-256.

    Every frame path is checked to stay inside the bundle before any file is opened. A
    bundle whose writing failed part way (``status: unwritten``, a full disk) is refused
    unless ``partial=True``: a verdict from part of the frames could say DOWN for want of them.

    Example: ``fx.bundle.open("incident-2026-11-30").frame("events")``
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    paths = frame_paths(folder, manifest)
    unwritten = manifest.get("unwritten_frames") or {}
    if unwritten and not partial:
        raise BundleError(f"{folder / MANIFEST_NAME}: {len(unwritten)} frame(s) could not be written when it was "
                          f"collected ({', '.join(unwritten)}: {next(iter(unwritten.values()))}); "
                          "fx.bundle.open(..., partial=True) reads the rest")
    frames: dict[str, pd.DataFrame] = {}
    for name, entry in manifest.get("frames", {}).items():
        frame = _read_checked(paths[name], entry["sha256"], verify)
        for column in entry.get("json_columns", []):
            # Built as a plain object Series: pandas' map on a string column would re-infer
            # the decoded lists and dicts into Arrow arrays and structs.
            frame[column] = pd.Series([_decode(v) for v in frame[column].tolist()], index=frame.index, dtype=object)
        frames[name] = frame
    gaps = [Gap(**gap) for gap in manifest.get("gaps", [])]
    return Evidence(deployment=manifest.get("deployment", {}), frames=frames, gaps=gaps,
                    commands=manifest.get("commands", []), window=manifest.get("window", {}),
                    collected_at=manifest.get("collected_at"))
