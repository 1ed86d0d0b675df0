"""``./run lab`` starts JupyterLab for whoever runs it, root included (the README's machine runs as root)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.server, pytest.mark.timeout(300)]


def test_run_lab_serves_the_notebooks_even_as_root(tmp_path):
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    lab = subprocess.Popen([str(ROOT / "run"), "lab", "--no-browser", "--ServerApp.port=0", "--ServerApp.ip=127.0.0.1",
                            "--ServerApp.token=''"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, start_new_session=True)
    seen = []
    try:
        selector = selectors.DefaultSelector()
        selector.register(lab.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # readiness: the server prints the URL it serves
            if not selector.select(timeout=5):
                if lab.poll() is not None:
                    break
                continue
            line = lab.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "http://127.0.0.1:" in line and "/lab" in line:
                break
        output = "".join(seen)
        assert "Running as root is not recommended" not in output, output[-2000:]
        assert any("http://127.0.0.1:" in line for line in seen), output[-2000:]
        assert lab.poll() is None, output[-2000:]
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
            try:
                lab.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.wait()
        lab.stdout.close()
