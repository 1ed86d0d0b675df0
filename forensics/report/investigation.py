"""``Investigation``: the folder a notebook builds up and the postmortem report reads.

Layout (docs/report.md)::

    DIR/
      investigation.toml          the manifest: target, release, times, and one [[part]] per part
      evidence/<name>/            evidence bundles (manifest.json + frames/*.parquet, docs/bundle.md)
      verdicts/<name>.json        verdicts (Verdict.to_dict())
      handlers/<name>/            saved handler diffs (diff.json, diff.html)
      campaigns/<name>/           saved campaigns (campaign.json, frames/, cycles/)
      plots/<name>.svg            plots (SVG)

``Investigation(DIR)`` opens the folder, or creates it (with its manifest) when it is absent
or empty. Every ``add_*`` method copies or writes the part into the folder and records it in
the manifest (rewritten atomically each time). Reading a part that the manifest lists but the
folder lacks raises :class:`~forensics.exitcodes.Undecided` naming it (exit 3).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.exitcodes import EnvironmentProblem, Undecided, environment_problem_from_os_error
from forensics.private_files import make_private_dir, write_private

SCHEMA = "pd-forensics-investigation/1"
MANIFEST = "investigation.toml"
KINDS = {  # kind: (sub-folder, what it is)
    "evidence": ("evidence", "an evidence bundle (forensics collect / fx.bundle.write)"),
    "verdict": ("verdicts", "a verdict (fx.diagnose(...).to_dict())"),
    "handler_diff": ("handlers", "a saved handler diff (forensics handlers diff --out)"),
    "campaign": ("campaigns", "a saved validation campaign (Campaign.save)"),
    "plot": ("plots", "a plot (SVG)"),
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Part:
    """One recorded part of an investigation."""

    kind: str
    name: str
    path: str  # relative to the investigation folder
    added: str  # ISO UTC
    about: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "path": self.path, "added": self.added, "about": self.about}


class Investigation:
    """An investigation folder: open or create it, add parts, read them back.

    Example: ``inv = fx.report.Investigation("incident-42", target="pd-prod-7", release="0.5.15")``
    """

    def __init__(self, directory: str | os.PathLike[str], *, target: str | None = None,
                 release: str | None = None, backend: str | None = None, title: str | None = None,
                 create: bool = True) -> None:
        self.directory = Path(directory)
        manifest = self.directory / MANIFEST
        if manifest.is_file():
            self._load(manifest)
            changed = False
            for key, value in (("target", target), ("release", release), ("backend", backend), ("title", title)):
                if value is not None and self.info.get(key) != value:
                    self.info[key] = value
                    changed = True
            if changed:
                self._save()
            return
        if not create or (self.directory.exists() and (not self.directory.is_dir() or any(self.directory.iterdir()))):
            raise Undecided(f"{manifest}: missing (not an investigation folder: no {MANIFEST})")
        now = _now()
        self.info: dict[str, Any] = {"title": title or "", "target": target or "", "release": release or "",
                                     "backend": backend or "", "created": now, "updated": now}
        self.parts: list[Part] = []
        self._save()

    # ------------------------------------------------------------------ manifest

    def _load(self, manifest: Path) -> None:
        try:
            doc = tomllib.loads(manifest.read_text(encoding="utf-8"))
        except OSError as exc:
            raise environment_problem_from_os_error(exc, str(manifest), "cannot read") from None
        except tomllib.TOMLDecodeError as exc:
            raise EnvironmentProblem(f"{manifest}: not valid TOML: {exc}", path=str(manifest)) from None
        if doc.get("schema") != SCHEMA:
            raise EnvironmentProblem(f"{manifest}: schema {doc.get('schema')!r} is not {SCHEMA!r}", path=str(manifest))
        self.info = dict(doc.get("investigation", {}))
        self.parts = [Part(p["kind"], p["name"], p["path"], p.get("added", ""), p.get("about", ""))
                      for p in doc.get("part", [])]

    def _save(self) -> None:
        import tomli_w

        doc = {"schema": SCHEMA, "investigation": {k: self.info.get(k, "") for k in
                                                   ("title", "target", "release", "backend", "created", "updated")},
               "kinds": {kind: about for kind, (_, about) in KINDS.items()},
               "part": [p.to_dict() for p in self.parts]}
        try:
            make_private_dir(self.directory)
            write_private(self.directory / MANIFEST, tomli_w.dumps(doc).encode("utf-8"))
        except OSError as exc:
            raise environment_problem_from_os_error(exc, str(self.directory), "cannot write the investigation") from None

    def _record(self, kind: str, name: str, about: str) -> Part:
        folder, _ = KINDS[kind]
        suffix = {"verdict": ".json", "plot": ".svg"}.get(kind, "")
        part = Part(kind, name, f"{folder}/{name}{suffix}", _now(), about)
        self.parts = [p for p in self.parts if not (p.kind == kind and p.name == name)] + [part]
        self.info["updated"] = part.added
        self._save()
        return part

    def _target(self, kind: str, name: str) -> Path:
        if not _NAME.match(name):
            raise ValueError(f"a part name is letters, digits, '.', '_' or '-' (got {name!r})")
        folder, _ = KINDS[kind]
        suffix = {"verdict": ".json", "plot": ".svg"}.get(kind, "")
        path = self.directory / folder / f"{name}{suffix}"
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        make_private_dir(path.parent)
        return path

    # ------------------------------------------------------------------ adding

    def add_bundle(self, evidence: Any, name: str = "incident", about: str = "") -> Part:
        """An evidence bundle: an ``Evidence`` (written with fx.bundle.write) or a bundle folder (copied)."""
        from forensics import bundle

        path = self._target("evidence", name)
        if isinstance(evidence, (str, os.PathLike)):
            bundle.open(evidence)  # refuse a broken bundle (or one leading outside itself) before copying it
            _copy_bundle(Path(evidence), path)
        else:
            bundle.write(evidence, path)
        return self._record("evidence", name, about or "evidence bundle")

    def add_verdict(self, verdict: Any, name: str = "incident", about: str = "") -> Part:
        """A verdict: a ``Verdict`` or its ``to_dict()`` document."""
        from forensics.jsonable import encode_json

        doc = verdict.to_dict() if hasattr(verdict, "to_dict") else dict(verdict)
        path = self._target("verdict", name)
        write_private(path, encode_json(doc) + b"\n")
        return self._record("verdict", name, about or f"verdict {doc.get('verdict', '?')}")

    def add_handler_diff(self, diff: Any, name: str = "handlers", about: str = "") -> Part:
        """A handler diff: the folder ``forensics handlers diff --out`` wrote, or a ``HandlerDiff``."""
        from forensics.jsonable import encode_json

        path = self._target("handler_diff", name)
        if isinstance(diff, (str, os.PathLike)):
            if not (Path(diff) / "diff.json").is_file():
                raise Undecided(f"{Path(diff) / 'diff.json'}: missing (not a saved handler diff)")
            _copy_tree(Path(diff), path)
        else:
            path.mkdir(parents=True)
            (path / "diff.json").write_bytes(encode_json(diff.to_dict()) + b"\n")
            (path / "diff.html").write_text(diff._repr_html_(), encoding="utf-8")
        return self._record("handler_diff", name, about or "handler diff")

    def add_campaign(self, campaign: Any, name: str = "validation", about: str = "") -> Part:
        """A campaign: the folder ``Campaign.save`` wrote, or a ``Campaign`` (saved here)."""
        path = self._target("campaign", name)
        if isinstance(campaign, (str, os.PathLike)):
            if not (Path(campaign) / "campaign.json").is_file():
                raise Undecided(f"{Path(campaign) / 'campaign.json'}: missing (not a saved campaign)")
            _copy_tree(Path(campaign), path)
        else:
            campaign.save(path)
        return self._record("campaign", name, about or "validation campaign")

    def add_plot(self, plot: Any, name: str, about: str = "") -> Part:
        """A plot: a matplotlib Figure (saved as deterministic SVG), SVG text, or an .svg file."""
        from .plots import figure_svg

        path = self._target("plot", name)
        if hasattr(plot, "savefig"):
            text = figure_svg(plot)
        elif isinstance(plot, os.PathLike) or (isinstance(plot, str) and not plot.lstrip().startswith("<")):
            text = Path(plot).read_text(encoding="utf-8")
        else:
            text = str(plot)
        path.write_text(text, encoding="utf-8")
        return self._record("plot", name, about or name)

    # ------------------------------------------------------------------ reading

    def of_kind(self, kind: str) -> list[Part]:
        """The parts of one kind, sorted by name."""
        return sorted((p for p in self.parts if p.kind == kind), key=lambda p: p.name)

    def path(self, part: Part) -> Path:
        path = self.directory / part.path
        if not path.exists():
            raise Undecided(f"{path}: missing ({part.kind} {part.name!r} is listed in {MANIFEST} but not there)")
        return path

    def missing(self) -> list[str]:
        """The listed parts whose files are not there (each as its path)."""
        return [str(self.directory / p.path) for p in self.parts if not (self.directory / p.path).exists()]

    def evidence(self, name: str | None = None) -> Any:
        """The named (else the first) evidence bundle as an ``Evidence``; None when there is none."""
        from forensics import bundle

        part = self._one("evidence", name)
        return None if part is None else bundle.open(self.path(part))

    def verdicts(self) -> dict[str, dict[str, Any]]:
        return {p.name: _read_json(self.path(p)) for p in self.of_kind("verdict")}

    def handler_diffs(self) -> dict[str, dict[str, Any]]:
        return {p.name: _read_json(self.path(p) / "diff.json") for p in self.of_kind("handler_diff")}

    def campaigns(self) -> dict[str, dict[str, Any]]:
        return {p.name: _read_json(self.path(p) / "campaign.json") for p in self.of_kind("campaign")}

    def plots(self) -> dict[str, str]:
        return {p.name: self.path(p).read_text(encoding="utf-8") for p in self.of_kind("plot")}

    def _one(self, kind: str, name: str | None) -> Part | None:
        parts = self.of_kind(kind)
        if name is not None:
            parts = [p for p in parts if p.name == name]
            if not parts:
                raise Undecided(f"{self.directory / MANIFEST}: no {kind} named {name!r}")
        return parts[0] if parts else None

    def __repr__(self) -> str:
        held = ", ".join(f"{p.kind}:{p.name}" for p in self.parts) or "empty"
        return f"<Investigation {str(self.directory)!r}: {held}>"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise Undecided(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise environment_problem_from_os_error(exc, str(path), "cannot read") from None
    except json.JSONDecodeError as exc:
        raise EnvironmentProblem(f"{path}: not valid JSON: {exc}", path=str(path)) from None


def _copy_bundle(source: Path, target: Path) -> None:
    """A checked bundle's manifest and the frame files it lists, nothing else (a bundle is a closed world)."""
    from forensics.bundle.store import MANIFEST_NAME, frame_paths, read_manifest

    paths = frame_paths(source, read_manifest(source))
    for relative in [MANIFEST_NAME, *(str(p.relative_to(source)) for p in paths.values())]:
        make_private_dir((target / relative).parent)
        write_private(target / relative, (source / relative).read_bytes())


def _copy_tree(source: Path, target: Path) -> None:
    if not source.is_dir():
        raise Undecided(f"{source}: missing")
    shutil.copytree(source, target)
