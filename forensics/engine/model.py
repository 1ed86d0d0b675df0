"""The model a real engine serves here: built locally, cached, never fetched from a hub.

A random-weight Llama written with transformers' ``save_pretrained`` and a WordLevel tokenizer
trained with ``tokenizers``, carrying a chat template so ``/v1/chat/completions`` works as well as
``/generate``. It is built by an engine environment's interpreter (:mod:`model_script`): the
project's own has no torch. Two sizes:

* ``tiny`` (2 layers, hidden 64): every request is instant; for tests;
* ``slow-prefill`` (8 layers, hidden 1024, about 120M parameters): a prefill of a 3000-token prompt
  takes seconds on 2 cores, the window in which a killed client makes the decode abort a pending
  KV transfer.

Each lives in ``<cache>/engine/models/<size>-<hash>/`` (the hash covers the size's shape and the
script's bytes; the weights are seeded). Its files' sizes and sha256 are recorded when it is
built and checked on every reuse; a damaged model is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forensics.cache import cache_dir
from forensics.exitcodes import EnvironmentProblem, UsageProblem

SCRIPT = Path(__file__).with_name("model_script.py")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int


SIZES = {
    "tiny": ModelShape(layers=2, hidden=64, intermediate=256, heads=4),
    "slow-prefill": ModelShape(layers=8, hidden=1024, intermediate=2816, heads=16),
}


class ModelBuildError(EnvironmentProblem):
    """The model could not be built or its cached files cannot be trusted (exit 4)."""


@dataclass(frozen=True)
class LocalModel:
    size: str
    path: Path
    parameters: int


def model_dir(size: str) -> Path:
    shape = _shape(size)
    digest = hashlib.sha256(json.dumps(shape.__dict__, sort_keys=True).encode() + SCRIPT.read_bytes()).hexdigest()
    return cache_dir() / "engine" / "models" / f"{size}-{digest[:12]}"


def _shape(size: str) -> ModelShape:
    if size not in SIZES:
        raise UsageProblem(f"unknown model size {size!r}: choose one of {', '.join(SIZES)}")
    return SIZES[size]


def _file_records(directory: Path) -> dict[str, list]:
    records = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != "manifest.json":
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023 - consumed here
                    digest.update(block)
            records[path.name] = [path.stat().st_size, digest.hexdigest()]
    return records


def _cached(directory: Path) -> LocalModel | None:
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if _file_records(directory) != manifest.get("files"):
        return None
    return LocalModel(manifest["size"], directory, int(manifest["parameters"]))


def build(size: str, python: str | Path) -> LocalModel:
    """The ``size`` model, built with the engine environment's ``python`` on first use, then reused."""
    directory = model_dir(size)
    found = _cached(directory)
    if found is not None:
        return found
    shape = _shape(size)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".tmp-{size}-", dir=directory.parent) as tmp:
        out = Path(tmp) / "model"
        command = [str(python), str(SCRIPT), str(out), str(shape.layers), str(shape.hidden),
                   str(shape.intermediate), str(shape.heads)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired as exc:
            raise ModelBuildError(f"building the {size} model with {python} timed out after 900 s") from exc
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise ModelBuildError(f"building the {size} model with {python} failed: {tail}")
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        manifest = {"size": size, "shape": shape.__dict__, "parameters": summary["parameters"],
                    "vocabulary": summary["vocabulary"], "files": _file_records(out)}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if directory.exists():
            shutil.rmtree(directory)  # damaged: found above not to match its manifest
        os.replace(out, directory)
    return LocalModel(size, directory, int(summary["parameters"]))


def prompt_words(count: int) -> str:
    """``count`` words the tokenizer knows (one token each), in a fixed order: a prompt of that length."""
    from forensics.engine.model_script import vocabulary_words

    words = vocabulary_words()
    return " ".join(words[i % len(words)] for i in range(count))
