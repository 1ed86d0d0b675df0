"""A deployment's own engine environment: a hard-link clone of the release's cached one.

The cached environment (``<cache>/engine/env/<release>-<hash>/``) stays pristine: CPU-adapted,
never patched. Each real-engine deployment runs from ``<cache>/engine/deployments/<key>/env/``
(``key``: a short hash of the deployment directory's resolved path), a tree of directories whose
files are hard links to the cached ones (``cp -al``, done here in Python): 2.8 GB cloned in a few
seconds and no disk. Symbolic links are copied as links (the venv's ``bin/python``).

Every write into a clone replaces a file by rename (the fix's codemod and the adaptations write a
temporary file and ``os.replace`` it; Python writes its ``.pyc`` files the same way), so a new
inode is made and the cached file's inode is never modified. ``twin down`` removes the clone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from forensics.cache import cache_dir
from forensics.exitcodes import EnvironmentProblem


class CloneError(EnvironmentProblem):
    """The engine environment could not be cloned (a full disk, another file system, ...)."""


def deployments_dir() -> Path:
    return cache_dir() / "engine" / "deployments"


def deployment_key(directory: Path) -> str:
    return hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:16]


def deployment_cache(directory: Path) -> Path:
    """``<cache>/engine/deployments/<key>/`` of the deployment in ``directory``."""
    return deployments_dir() / deployment_key(directory)


def clone_tree(source: Path, destination: Path) -> int:
    """Hard-link every file of ``source`` into a new ``destination`` tree; returns the files linked."""
    if destination.exists():
        raise CloneError(f"{destination}: already exists (a clone is made fresh)", path=str(destination))
    linked = 0
    try:
        for root, dirs, files in os.walk(source):
            relative = os.path.relpath(root, source)
            target = destination / relative if relative != "." else destination
            target.mkdir(parents=True, exist_ok=relative == ".")
            shutil.copystat(root, target)
            for name in dirs:
                path = os.path.join(root, name)
                if os.path.islink(path):  # os.walk does not descend into it: copy the link itself
                    os.symlink(os.readlink(path), target / name)
            for name in files:
                path = os.path.join(root, name)
                if os.path.islink(path):
                    os.symlink(os.readlink(path), target / name)
                else:
                    os.link(path, target / name)
                    linked += 1
    except OSError as exc:
        shutil.rmtree(destination, ignore_errors=True)
        raise CloneError(f"cannot clone the engine environment {source} into {destination}: {exc.strerror} "
                         f"({exc.filename})", path=str(destination)) from None
    return linked


def clone_environment(environment_root: Path, directory: Path) -> Path:
    """A fresh clone of ``environment_root`` for the deployment in ``directory``; returns the clone's root.

    A clone left by an earlier deployment in the same directory (taken down without ``twin down``)
    is removed first: the caller has checked that nothing of that deployment runs.
    """
    home = deployment_cache(directory)
    clone = home / "env"
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / "directory").write_text(str(Path(directory).resolve()) + "\n")
    clone_tree(environment_root, clone)
    return clone


def users(directory: Path) -> list[int]:
    """Pids of live processes whose program lies in the deployment's clone (its venv's python).

    What ``remove`` must not pull out from under: a deployment whose records no longer prove
    its processes (see ``records``) may still have them running from the clone."""
    import psutil

    home = str(deployment_cache(directory).resolve()) + os.sep
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info.get("cmdline") or []
        if argv and os.path.abspath(argv[0]).startswith(home):
            found.append(proc.info["pid"])
    return sorted(found)


def remove(directory: Path) -> Path | None:
    """Remove the deployment's clone (and its backups); returns what was removed, None if nothing was."""
    home = deployment_cache(directory)
    if not home.exists():
        return None
    shutil.rmtree(home)
    return home
