"""A real Prometheus (Debian's package) for the tests: started on a free port, ready when it answers.

``running_prometheus(tmp_path, targets, interval)`` is a context manager giving a
``PrometheusAPI``; ``targets`` maps ``host:port`` to the labels Prometheus attaches.
It waits on readiness (and on ``ready_when(api)`` if given), never on a fixed sleep,
and stops the server on exit.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sshd_helpers import free_port

READY_TIMEOUT_S = 120.0


@contextmanager
def running_prometheus(tmp_path: Path, targets: dict[str, dict[str, str]], interval: str = "500ms",
                       ready_when: Callable | None = None) -> Iterator:
    from forensics.collectors.prometheus_api import PrometheusAPI

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian package `prometheus`; ./run installs it)")
    seconds = float(interval.removesuffix("ms")) / 1000 if interval.endswith("ms") else float(interval.removesuffix("s"))
    static = "".join(
        f"      - targets: ['{address}']\n        labels: {{{', '.join(f'{k}: {v}' for k, v in labels.items())}}}\n"
        for address, labels in targets.items())
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: {interval}\n  scrape_timeout: {int(seconds * 750)}ms\n"
                      "scrape_configs:\n  - job_name: sglang\n    static_configs:\n" + static)
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        api = PrometheusAPI(f"http://127.0.0.1:{port}", timeout_s=10)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            pause = threading.Event()  # never set: a bounded wait between readiness checks
            while not (api.ready() and (ready_when is None or ready_when(api))):
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "Prometheus not ready"
                pause.wait(0.1)
            yield api
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
