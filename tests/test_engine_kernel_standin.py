"""The sgl-kernel stand-in (``forensics/engine/standin_src/sgl_kernel``) against the contract of sgl-kernel's CPU ops.

The checks run in the 0.5.16 engine environment's python (it has torch; the project's has not),
where the stand-in is installed and sglang's own callers of it live: ``kernel_standin_checks.py``
prints one result per check. The wheel itself is checked here, in the project's python.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from forensics.engine import environment, kernel_standin, pins
from forensics.exitcodes import EnvironmentProblem

# Slow: it builds the 0.5.16 engine environment (minutes on a fresh machine) beside 0.5.15's.
pytestmark = [pytest.mark.engine, pytest.mark.slow]

RELEASE = "0.5.16"
CHECKS = Path(__file__).with_name("kernel_standin_checks.py")


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    try:
        env = environment.prepare(RELEASE)
    except EnvironmentProblem as problem:
        pytest.skip(f"the sglang {RELEASE} engine environment cannot be built here: {problem}")
    proc = subprocess.run([str(env.python), str(CHECKS)], capture_output=True, text=True, timeout=600,
                          env=environment.engine_environment_variables() | {"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


CHECK_NAMES = [
    "assign matches the kernel's scatter on random batches, int32 and int64 indices",
    "assign as sglang's allocator calls it (0.5.16 allocation.py:640): lens tensors, in place",
    "assign refuses what the kernel's CHECKs refuse",
    "copy moves every layer's K and V rows, gather before scatter, int32 and int64 locations",
    "copy of nothing is a no-op; bad dtypes are refused",
    "anything else is an ImportError naming the stand-in; no torch.ops.sgl_kernel op appears",
    "sglang's own callers (0.5.16 allocation.py:631, cache_move.py:96) run on the stand-in",
]


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_the_stand_in_keeps_the_contract(results, name):
    assert results.get(name) == "ok", results.get(name, f"check {name!r} did not run: {sorted(results)}")


def test_every_check_is_asserted(results):
    assert sorted(results) == sorted(CHECK_NAMES)


def test_the_wheel_is_deterministic_and_holds_only_the_stand_in(tmp_path):
    first = kernel_standin.build_wheel(tmp_path / "a").read_bytes()
    wheel = kernel_standin.build_wheel(tmp_path / "b")
    assert wheel.read_bytes() == first
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert archive.read(kernel_standin.MODULE) == kernel_standin.SOURCE.read_bytes()
        metadata = archive.read(f"pd_forensics_sgl_kernel_standin-{kernel_standin.VERSION}.dist-info/METADATA")
    assert [n for n in names if not n.startswith("pd_forensics_sgl_kernel_standin-")] == [kernel_standin.MODULE]
    assert b"Name: pd-forensics-sgl-kernel-standin" in metadata  # not sgl-kernel: no version check is fooled


def test_only_the_releases_that_import_sgl_kernel_ops_get_it():
    assert pins.needs_kernel_standin("0.5.16")
    assert kernel_standin.DISTRIBUTION in pins.expected_versions("0.5.16")
    for release in ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1"):
        assert kernel_standin.DISTRIBUTION not in pins.expected_versions(release)
