"""sglang source from the wheel cache, a directory and an install; clear errors otherwise."""

from __future__ import annotations

import re
import shutil

import pytest

from forensics import sglang_source
from forensics.exitcodes import EnvironmentProblem


def test_fetch_keeps_checksum_and_only_srt():
    source = sglang_source.fetch("0.5.15")
    assert re.fullmatch(r"[0-9a-f]{64}", source.sha256) and source.wheel_name.startswith("sglang-0.5.15-")
    unpacked = {p.name for p in (source.root / "sglang").iterdir()}
    assert "srt" in unpacked and unpacked <= {"_version.py", "srt", "version.py"}
    assert {"nixl", "mooncake", "mori", "ascend"} <= set(source.backends())
    assert source.backend_file("nixl").name == "conn.py"
    assert source.shared_file("common").is_file()
    assert sglang_source.fetch("0.5.15", offline=True) == source  # cached: offline mode raises before any download


def test_directory_copy_reports_its_version(tmp_path):
    source = sglang_source.fetch("0.5.23")
    # copyfile: the cache's files are read-only, this copy is edited below (as any user)
    shutil.copytree(source.root / "sglang", tmp_path / "site" / "sglang", copy_function=shutil.copyfile)
    (tmp_path / "site" / "sglang" / "_version.py").write_text("__version__ = version = '0.5.23'\n")
    copy = sglang_source.from_directory(tmp_path / "site")
    assert copy.version == "0.5.23" and copy.origin == "directory"
    assert copy.backend_file("nixl").read_text() == source.backend_file("nixl").read_text()


def test_missing_pieces_name_themselves(tmp_path):
    with pytest.raises(EnvironmentProblem, match="no sglang/srt tree"):
        sglang_source.from_directory(tmp_path)
    with pytest.raises(EnvironmentProblem, match="not a valid sglang release"):
        sglang_source.fetch("not-a-version")
    source = sglang_source.fetch("0.5.15")
    with pytest.raises(EnvironmentProblem, match="has no sglang/srt/disaggregation/nosuch/conn.py"):
        source.backend_file("nosuch")


@pytest.mark.timeout(300)
def test_release_that_does_not_exist_is_a_named_error():
    with pytest.raises(EnvironmentProblem, match="0.5.99"):
        sglang_source.fetch("0.5.99")


def test_available_releases_lists_the_0_5_line():
    releases = sglang_source.available_releases("0.5.1", "0.5.23")
    assert releases[0] == "0.5.1" and releases[-1] == "0.5.23"
    assert "0.5.15.post1" in releases and len(releases) == 42
