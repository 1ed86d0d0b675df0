"""A small "deployment" for the deploy tests: sglang's files copied into a temporary directory, the twin's URLs.

Its prefill engine's ``sglang_location`` is the copy, its process selector and (unless the
test names another) its restart line the twin's prefill's: a deploy to it writes the copy
and really restarts the twin's prefill, so the check that the engine restarted after the
write and the liveness check are both real.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w
from cli_helpers import run_forensics
from live_helpers import ssh_inventory

from patched_engine.remote_file import KILL_ENV


def with_engine_fields(path: Path, fields: dict) -> Path:
    """Add python/sglang_location/restart (per role) to an inventory written by ``ssh_inventory``."""
    document = tomllib.loads(path.read_text())
    for engine in document["engine"]:
        engine.update(fields.get(engine["role"], {}))
    path.write_text(tomli_w.dumps(document))
    return path


def fake_site(directory: Path, wheel: dict, conn: bytes) -> Path:
    """A site-packages holding sglang 0.5.15's version file and the given nixl/conn.py."""
    site = directory / "site-packages"
    nixl = site / "sglang/srt/disaggregation/nixl"
    nixl.mkdir(parents=True, exist_ok=True)
    (site / "sglang/__init__.py").write_text("")
    shutil.copyfile(Path(wheel["root"]) / "sglang/_version.py", site / "sglang/_version.py")
    (nixl / "conn.py").write_bytes(conn)
    (nixl / "conn.py").chmod(0o644)
    return site


def fake_deployment(directory: Path, twin, wheel: dict, *, conn: bytes | None = None, sshd=None,
                    restart: str | None = None) -> tuple[Path, Path]:
    """(inventory, conn.py): a prefill whose sglang is a copy in ``directory``, URLs the twin's.

    Locally (``sshd=None``) the engines run on ``local``; else on the test sshd. Not a twin:
    there is no ``[twin]`` table, so deploy needs ``yes``. ``restart``: the prefill's restart
    line (default: the twin's prefill restart).
    """
    site = fake_site(directory, wheel, wheel["original"] if conn is None else conn)
    line = restart if restart is not None else twin.inventory.engine("prefill").restart
    fields = {"prefill": {"python": sys.executable, "sglang_location": str(site), "restart": line}}
    if sshd is not None:
        path = ssh_inventory(twin, sshd, directory / "inventory.toml", logs=None, name="fake-over-ssh")
    else:
        document = tomllib.loads(Path(twin.inventory_path).read_text())
        document.pop("twin")
        document["deployment"]["name"] = "fake-local"
        path = directory / "inventory.toml"
        path.write_text(tomli_w.dumps(document))
    return with_engine_fields(path, fields), site / "sglang/srt/disaggregation/nixl/conn.py"


def forensics(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``forensics patch ARGS`` in a child process, without an inherited kill point."""
    return run_forensics("patch", *args, env=env, timeout=timeout, drop_env=(KILL_ENV,))
