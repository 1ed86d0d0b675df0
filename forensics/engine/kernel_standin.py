"""The sgl-kernel stand-in: a tiny wheel, built here, that an engine environment installs for releases needing it.

From 0.5.16 sglang's CPU path imports two of sgl-kernel's CPU ops at module level
(``srt/mem_cache/allocation.py:46``, ``kernels/ops/kvcache/cache_move.py:10``); PyPI's
sgl-kernel/sglang-kernel builds are CUDA-only. The stand-in (``standin_src/sgl_kernel``) holds
those two ops written in torch after sgl-kernel's own CPU kernels, and nothing else: every other
name raises ImportError naming it. It is its own distribution, ``pd-forensics-sgl-kernel-standin``
(``pip show sgl-kernel`` finds nothing, as is true), so no version check mistakes it for sgl-kernel.
Nothing of sglang is changed for it.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

DISTRIBUTION = "pd-forensics-sgl-kernel-standin"
VERSION = "1.0"
MODULE = "sgl_kernel/__init__.py"  # relative to site-packages
SOURCE = Path(__file__).parent / "standin_src" / MODULE


def source_text() -> str:
    return SOURCE.read_text(encoding="utf-8")


def source_sha256() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(directory: Path) -> Path:
    """Write the stand-in's wheel into ``directory`` and return its path (deterministic bytes)."""
    stem = DISTRIBUTION.replace("-", "_")
    info = f"{stem}-{VERSION}.dist-info"
    files = {
        MODULE: SOURCE.read_bytes(),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {VERSION}\n"
                             "Summary: pd-forensics' torch stand-in for the sgl-kernel CPU ops sglang's CPU "
                             "path imports (engine environments only)\nRequires-Dist: torch\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pd-forensics\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": b"sgl_kernel\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{stem}-{VERSION}-py3-none-any.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    tmp.replace(wheel)
    return wheel
