"""A real JupyterLab server and Debian's chromium, for tests that look at what a user sees.

Playwright cannot download its own browsers here, so it drives the chromium Debian installs
(``executable_path``); as root chromium refuses to start without ``--no-sandbox``. The server runs
the venv's interpreter with every Jupyter directory (and HOME) in the test's tmp folder, so
nothing from the user's Jupyter settings, kernels or workspaces leaks into what the test sees.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

# --disable-dev-shm-usage: containers often have a tiny /dev/shm, on which chromium's renderer crashes.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
SERVER_READY_DEADLINE_S = 120.0  # a loaded 2-core CI machine takes a while to import JupyterLab


def chromium_executable() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def require_browser() -> str:
    """Debian's chromium, or skip saying what is missing (./run test installs both as root)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    executable = chromium_executable()
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install chromium; ./run test does it as root)")
    return executable


def launch_chromium(playwright, executable: str):
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Lab:
    port: int
    token: str
    root_dir: Path
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}?token={self.token}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"


def _user_pip_config() -> str | None:
    """The user's pip config file: the kernel's ``pip download`` of a release must keep its index."""
    if os.environ.get("PIP_CONFIG_FILE"):
        return os.environ["PIP_CONFIG_FILE"]
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    for candidate in (config_home / "pip" / "pip.conf", Path.home() / ".pip" / "pip.conf"):
        if candidate.is_file():
            return str(candidate)
    return None


def _server_env(work: Path) -> dict[str, str]:
    from forensics.cache import cache_dir

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "XDG_")) and k not in ("PYTHONSTARTUP", "IPYTHONDIR")}
    dirs = {"HOME": "home", "JUPYTER_CONFIG_DIR": "jupyter-config", "JUPYTER_DATA_DIR": "jupyter-data",
            "JUPYTER_RUNTIME_DIR": "jupyter-runtime", "IPYTHONDIR": "ipython"}
    for var, name in dirs.items():
        (work / name).mkdir(parents=True, exist_ok=True)
        env[var] = str(work / name)
    # The kernel (ipykernel's kernelspec runs `python`, or sys.executable) must be the venv's python.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # The sglang sources are cached under the user's cache dir; a new HOME must not mean a new download.
    env["PD_FORENSICS_CACHE"] = str(cache_dir())
    pip_config = _user_pip_config()
    if pip_config:
        env["PIP_CONFIG_FILE"] = pip_config
    return env


def _quiet_settings(settings_dir: Path) -> None:
    """No news or update toasts: they ask for a click and cover the outputs in a screenshot."""
    notification = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def _status(lab: Lab) -> dict | None:
    try:
        with urllib.request.urlopen(lab.url("/api/status"), timeout=5) as response:
            return json.loads(response.read())
    except (OSError, ValueError):  # refused, reset, timed out, not JSON yet
        return None


def _shutdown(server: subprocess.Popen, lab: Lab) -> None:
    """Stop the server and everything it started: its kernels run in their own sessions."""
    try:
        started = psutil.Process(server.pid).children(recursive=True)
    except psutil.Error:
        started = []
    if server.poll() is None:
        request = urllib.request.Request(lab.url("/api/shutdown"), method="POST")
        try:  # the server's own shutdown stops its kernels first
            urllib.request.urlopen(request, timeout=10).close()
        except OSError:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if server.poll() is None:
            try:
                os.killpg(server.pid, sig)
            except ProcessLookupError:
                pass
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                continue
    survivors = [p for p in started if p.is_running()]
    for proc in survivors:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(survivors, timeout=10)


@contextmanager
def jupyterlab(root_dir: Path, work: Path) -> Iterator[Lab]:
    """JupyterLab serving ``root_dir`` on 127.0.0.1, ready (``/api/status`` answers); always stopped."""
    lab = Lab(port=free_port(), token=secrets.token_hex(24), root_dir=root_dir, log=work / "jupyterlab.log")
    settings = work / "lab-user-settings"
    _quiet_settings(settings)
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={lab.port}",
        "--ServerApp.port_retries=0",  # another port would be one the test does not know
        f"--IdentityProvider.token={lab.token}", f"--ServerApp.root_dir={root_dir}",
        f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={work / 'lab-workspaces'}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: the test runs the notebook's commands
        "--ServerApp.open_browser=False",
    ]
    if os.geteuid() == 0:  # CI runs as root; JupyterLab refuses that unless told
        command.append("--allow-root")
    with open(lab.log, "wb") as log:
        server = subprocess.Popen(command, cwd=root_dir, env=_server_env(work), stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_READY_DEADLINE_S
        while _status(lab) is None:
            if server.poll() is not None:
                raise AssertionError(f"jupyter lab exited {server.returncode} before it was ready:\n{lab.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"jupyter lab not ready within {SERVER_READY_DEADLINE_S:.0f} s:\n"
                                     f"{lab.log_tail()}")
            try:
                server.wait(timeout=0.25)  # returns at once if it dies; else the poll interval
            except subprocess.TimeoutExpired:
                pass
        yield lab
    finally:
        _shutdown(server, lab)
