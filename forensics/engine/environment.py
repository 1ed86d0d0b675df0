"""The engine environment: a release's own Python environment, as on a real engine host.

The first use of a release builds it under ``<cache>/engine/env/<release>-<pin hash>/`` (beside
the wheel cache) and every later use re-verifies it: torch's CPU build, that release's sglang
(installed ``--no-deps`` from the verified wheel of :mod:`forensics.sglang_source`), the
dependencies it imports, NIXL and sglang-router, each pinned (:mod:`forensics.engine.pins`),
then the CPU adaptations (:mod:`forensics.engine.adaptations`). It is separate from the
project's environment, which has no torch.

Building is a sequence of steps recorded in ``state.json`` as each finishes: a failure raises
:class:`EngineEnvironmentError` naming the step and, where pip says it, the package, and keeps
what was built; the next call resumes at the step that failed. Only the package registries pip
is configured with are used (no model hub, no other download).

A reused environment is checked before it is handed out: every pinned distribution at its
version (read from the environment's own metadata) and every adapted file's sha256 as recorded
when it was adapted. A mismatch re-runs the steps from the first one it concerns.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from forensics.cache import cache_dir
from forensics.engine import adaptations, pins
from forensics.exitcodes import EnvironmentProblem
from forensics.progress import Progress, step_reporter

STATE_FORMAT = 1
PIP_TIMEOUT_S = 1800


class EngineEnvironmentError(EnvironmentProblem):
    """An engine environment could not be built or verified; the message names the step and package."""


@dataclass(frozen=True)
class EngineEnvironment:
    """A built, verified engine environment for one sglang release."""

    version: str
    root: Path  # <cache>/engine/env/<release>-<hash>
    site_packages: Path
    timings: dict[str, float]  # seconds per step run by this call (empty when it was reused)

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def venv(self) -> Path:
        return self.root / "venv"


def environments_dir() -> Path:
    path = cache_dir() / "engine" / "env"
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment_dir(version: str) -> Path:
    """Where ``version``'s engine environment lives (built or not)."""
    pins.check_release(version)
    return environments_dir() / f"{version}-{pins.pin_hash(version, adaptations.adaptation_ids())}"


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """One builder per environment across processes (a second waits, then finds it built)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_state(root: Path) -> dict:
    path = root / "state.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"format": STATE_FORMAT, "done": [], "adapted": {}}
    except (OSError, ValueError) as exc:
        raise EngineEnvironmentError(f"{path}: unreadable build record ({exc}); remove {root} to rebuild it",
                                     path=str(path)) from exc
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        return {"format": STATE_FORMAT, "done": [], "adapted": {}}
    return data


def _write_state(root: Path, state: dict) -> None:
    path = root / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, path)


STEPS = ("venv", "torch", "dependencies", "sglang", "engine extras", "adaptations", "imports")


def prepare(version: str, *, progress: Progress = None) -> EngineEnvironment:
    """``version``'s engine environment, built on first use (resumed after a failure), verified on reuse.

    ``progress`` is read as :func:`forensics.progress.step_reporter` reads it: each finished step
    is reported by name. Raises :class:`EngineEnvironmentError` (exit 4) naming the step and package.
    """
    root = environment_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root.parent / f".{root.name}.lock"):
        state = _read_state(root)
        state["done"] = [s for s in state.get("done", []) if s in STEPS]
        if len(state["done"]) == len(STEPS):
            problem = _verification_problem(root, version, state)
            if problem is None:
                return EngineEnvironment(version, root, _site_packages(root), {})
            first_bad, _why = problem
            state["done"] = state["done"][: STEPS.index(first_bad)]
            _write_state(root, state)
        timings: dict[str, float] = {}
        with step_reporter(progress, len(STEPS), f"engine environment sglang {version}") as step:
            for name in STEPS:
                if name in state["done"]:
                    if step:
                        step(f"{name} (kept)")
                    continue
                started = time.monotonic()
                _run_step(name, root, version, state)
                timings[name] = round(time.monotonic() - started, 1)
                state["done"].append(name)
                _write_state(root, state)
                if step:
                    step(name)
        problem = _verification_problem(root, version, state)
        if problem is not None:
            raise EngineEnvironmentError(f"sglang {version} engine environment at {root}: built, but {problem[1]}",
                                         path=str(root))
        return EngineEnvironment(version, root, _site_packages(root), timings)


# ----------------------------------------------------------------------------- steps


def _site_packages(root: Path) -> Path:
    found = sorted((root / "venv" / "lib").glob("python3*/site-packages"))
    if not found:
        raise EngineEnvironmentError(f"{root / 'venv'} has no site-packages", path=str(root / "venv"))
    return found[0]


def _run_step(name: str, root: Path, version: str, state: dict) -> None:
    python = root / "venv" / "bin" / "python"
    if name == "venv":
        _run([sys.executable, "-m", "venv", "--clear", str(root / "venv")], step=name, packages=["venv"])
        return
    if name in ("torch", "dependencies", "engine extras"):
        requirements = dict(pins.install_steps(version))[name]
        # A step redone because a file of it was damaged must reinstall the same versions.
        _pip(python, requirements, step=name, force=name == "engine extras")
        return
    if name == "sglang":
        from forensics.sglang_source import fetch

        source = fetch(version)  # the verified wheel: the same bytes the adaptations are derived from
        wheel = source.root.parent / (source.wheel_name or "")
        if not wheel.is_file():
            raise EngineEnvironmentError(f"sglang {version}: the cached wheel {wheel} is missing", path=str(wheel))
        _pip(python, [str(wheel)], step=name, names=[f"sglang=={version}"], force=True)
        return
    if name == "adaptations":
        state["adapted"] = apply_adaptations(_site_packages(root))
        return
    if name == "imports":
        _check_imports(python)
        return
    raise AssertionError(name)


def apply_adaptations(site_packages: Path) -> dict[str, dict]:
    """Apply every CPU adaptation to the files under ``site_packages``; returns what each did.

    Line counts are kept (see :mod:`forensics.engine.adaptations`); a file already adapted is left
    as it is. The record per file: adaptation name, lines changed, sha256 of the adapted bytes."""
    record = {}
    for adaptation in adaptations.ADAPTATIONS:
        path = site_packages / adaptation.file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise EngineEnvironmentError(f"{path}: cannot read it to apply {adaptation.name}: {exc}",
                                         path=str(path)) from exc
        result = adaptation.apply(text, str(path))
        if result.changed:
            tmp = path.with_name(path.name + ".pd-forensics-tmp")
            tmp.write_text(result.new_text, encoding="utf-8")
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
            for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                cached.unlink(missing_ok=True)
        record[adaptation.file] = {"adaptation": adaptation.name, "lines": list(result.lines) or None,
                                   "sha256": result.sha256}
    return record


# The modules a prefill, a decode and the router import on their way up, checked once after a build.
IMPORT_CHECK = (
    "import torch, torchvision.io, transformers, tokenizers, nixl._api, sglang_router, "
    "sglang.srt.disaggregation.nixl.conn, sglang.srt.entrypoints.http_server"
)


def _check_imports(python: Path) -> None:
    env = dict(os.environ, **engine_environment_variables())
    proc = subprocess.run([str(python), "-c", IMPORT_CHECK], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        missing = re.search(r"No module named '([^']+)'", proc.stderr or "")
        what = f"the module {missing.group(1)!r} is missing" if missing else "an import fails"
        raise EngineEnvironmentError(f"engine environment {python}: {what}: {' | '.join(tail)}", path=str(python))


def engine_environment_variables() -> dict[str, str]:
    """What every engine process of this environment runs with (the measured recipe).

    ``SGLANG_USE_CPU_ENGINE`` is what ``is_cpu()`` reads (``utils/common.py:207-209``); without it
    the rotary embedding imports ``vllm._custom_ops``. ``SGL_FORCE_SHUTDOWN`` is never set: it
    changes the very shutdown a wedged prefill shows."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_HOST_IP": "127.0.0.1",
        "UCX_NET_DEVICES": "lo",
        "UCX_TLS": "tcp,sm,self",
    }


_PIP_NAMED = (
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"Could not find a version that satisfies the requirement (\S+)"),
    re.compile(r"Failed to build (\S+)"),
    re.compile(r"Failed building wheel for (\S+)"),
    re.compile(r"ERROR: (?:Could not install|Cannot install) (\S+)"),
)


def _pip(python: Path, requirements: list[str], *, step: str, names: list[str] | None = None,
         force: bool = False) -> None:
    command = [str(python), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
               "--no-input", "--quiet", *(["--force-reinstall"] if force else []), *requirements]
    _run(command, step=step, packages=names or requirements)


def _run(command: list[str], *, step: str, packages: list[str]) -> None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise EngineEnvironmentError(f"engine environment, step {step!r}: timed out after {PIP_TIMEOUT_S} s "
                                     f"installing {_short(packages)}") from exc
    if proc.returncode == 0:
        return
    output = "\n".join(line for line in (proc.stderr + "\n" + proc.stdout).splitlines()
                       if line.strip() and "is ignored: it is neither a file nor a directory" not in line)
    package = None
    for pattern in _PIP_NAMED:
        found = pattern.search(output)
        if found:
            package = found.group(1).rstrip(",.")
            break
    if package is None and "No space left on device" in output:
        package = "(disk full: No space left on device)"
    last = output.strip().splitlines()[-1] if output.strip() else f"exit status {proc.returncode}"
    raise EngineEnvironmentError(
        f"engine environment, step {step!r}: could not install {package or _short(packages)}: {last} "
        "(what was built is kept; the next run resumes at this step)")


def _short(packages: list[str]) -> str:
    return ", ".join(packages) if len(packages) <= 4 else f"{', '.join(packages[:3])} and {len(packages) - 3} more"


# ----------------------------------------------------------------------------- verification

_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as md, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in md.distributions()}))"
)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _verification_problem(root: Path, version: str, state: dict) -> tuple[str, str] | None:
    """(first step to redo, why) when the environment does not hold what its pins say, else None."""
    python = root / "venv" / "bin" / "python"
    if not python.exists():
        return "venv", f"{python} is missing"
    try:
        proc = subprocess.run([str(python), "-c", _LIST_DISTRIBUTIONS], capture_output=True, text=True, timeout=120)
        installed = {_normal(k): v for k, v in json.loads(proc.stdout).items()}
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return "venv", f"{python} cannot list its packages ({exc})"
    step_of = {}
    for step, requirements in pins.install_steps(version):
        for requirement in requirements:
            step_of[_normal(requirement.split("==")[0])] = step
    step_of["sglang"] = "sglang"
    for name, pinned in pins.expected_versions(version).items():
        found = installed.get(_normal(name))
        if found is None or found.split("+")[0] != pinned:
            return step_of[_normal(name)], f"{name} is {found or 'not installed'}, pinned {pinned}"
    try:
        site = _site_packages(root)
    except EngineEnvironmentError as exc:
        return "venv", str(exc)
    for relative, record in state.get("adapted", {}).items():
        path = site / relative
        owner = "sglang" if relative.startswith("sglang/") else "engine extras"  # the step that installs it
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return owner, f"{path} is missing"
        digest = adaptations.sha256_text(text)
        if digest != record.get("sha256"):
            # A fix deployed into the environment is not damage: `patch status` reads that file.
            if relative == adaptations.NIXL_CONN and "PD_FORENSICS_PATCH" in text:
                continue
            return owner, f"{path} is not the adapted file recorded at build time (sha256 {digest[:12]}…)"
    if not state.get("adapted"):
        return "adaptations", "no adapted file is recorded"
    return None
