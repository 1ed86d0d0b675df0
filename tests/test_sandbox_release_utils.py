"""The sglang.srt.utils helpers the sandbox serves are the release's own definitions, or refused."""

from __future__ import annotations

import pytest

from forensics.sandbox.errors import SandboxError
from forensics.sandbox.release_utils import (
    RELEASE_HELPERS,
    release_helpers,
    serve_release_helpers,
    utils_file,
)
from forensics.sandbox.stubs import Stub
from forensics.sglang_source import fetch


@pytest.mark.parametrize(("release", "file"), [("0.5.1", "sglang/srt/utils.py"),
                                               ("0.5.6", "sglang/srt/utils/common.py")])
def test_helpers_are_compiled_from_the_releases_own_utils_file(release, file):
    root = fetch(release).root
    helpers = release_helpers(root)
    assert set(helpers) == set(RELEASE_HELPERS)
    for helper in helpers.values():  # the release's file and line numbers, as tracebacks show them
        assert helper.__code__.co_filename == str(root / file)
    assert utils_file(root) == root / file
    assert helpers["maybe_wrap_ipv6_address"]("fd00::17") == "[fd00::17]"
    assert helpers["maybe_wrap_ipv6_address"]("10.0.3.17") == "10.0.3.17"
    assert helpers["format_tcp_address"]("fd00::17", 17001) == "tcp://[fd00::17]:17001"
    assert helpers["get_int_env_var"]("PD_FORENSICS_UNSET_QUEUE_SIZE", 4) == 4


def test_serving_replaces_only_the_stubs_of_served_helpers():
    module_globals = {"format_tcp_address": Stub("sglang.srt.utils.format_tcp_address"),
                      "get_ip": Stub("sglang.srt.utils.get_ip"), "maybe_wrap_ipv6_address": str}
    assert serve_release_helpers(module_globals, fetch("0.5.6").root) == ["format_tcp_address"]
    assert module_globals["format_tcp_address"]("127.0.0.1", 5) == "tcp://127.0.0.1:5"
    assert isinstance(module_globals["get_ip"], Stub)  # which host this is: not a pure helper
    assert module_globals["maybe_wrap_ipv6_address"] is str  # not a stub: left alone


def test_a_helper_that_reaches_beyond_the_standard_library_is_refused(tmp_path):
    utils = tmp_path / "sglang" / "srt" / "utils.py"
    utils.parent.mkdir(parents=True)
    utils.write_text("import torch\n\n\ndef maybe_wrap_ipv6_address(address: str) -> str:\n"
                     "    return torch.wrap(address)\n")
    with pytest.raises(SandboxError, match="'torch'.*'import torch'.*not the standard library"):
        release_helpers(tmp_path, ["maybe_wrap_ipv6_address"])
