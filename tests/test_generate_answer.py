"""The /generate answer's keys, read from each release's tokenizer manager (forensics.twin.generate_answer).

The reference is real sglang 0.5.15's own answer to the fidelity scenario's served request
(``tests/data/real-engine-0.5.15/marks.json``), not the twin's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics import sglang_source
from forensics.twin import wire
from forensics.twin.generate_answer import AnswerKeys, answer_keys

VULNERABLE = ("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1")
REAL = json.loads((Path(__file__).parent / "data" / "real-engine-0.5.15" / "marks.json").read_text())["generate_answer"]
# Real 0.5.13's PD decode answered its warm-up request (logged whole in its start-up log).
REAL_0513 = (Path(__file__).parent / "data" / "real-engine-0.5.13" / "decode-startup.log").read_text()


def test_real_0515s_answer_is_what_its_source_says():
    keys = answer_keys(sglang_source.fetch("0.5.15"))
    assert keys.unread == ()
    assert set(keys.top) == set(REAL) and set(keys.meta) == set(REAL["meta_info"])


@pytest.mark.parametrize("release", [*VULNERABLE, "0.5.16"])
def test_every_release_is_read_whole(release):
    keys = answer_keys(sglang_source.fetch(release))
    assert keys.unread == ()
    assert set(keys.top) == {"text", "output_ids", "meta_info"}
    assert {"id", "finish_reason", "prompt_tokens", "completion_tokens", "e2e_latency"} <= set(keys.meta)


def test_real_0513s_answer_is_what_its_source_says():
    import ast
    import re

    logged = re.search(r"Disaggregation warmup request completed with status 200, resp: (\[.*\])$", REAL_0513, re.M)
    [answer] = ast.literal_eval(logged.group(1))  # sglang logs the Python repr of the answers
    keys = answer_keys(sglang_source.fetch("0.5.13"))
    assert set(keys.top) == set(answer) and set(keys.meta) == set(answer["meta_info"])


def _fake_release(tmp_path: Path, handler_body: str) -> sglang_source.SglangSource:
    managers = tmp_path / "sglang" / "srt" / "managers"
    managers.mkdir(parents=True)
    (tmp_path / "sglang" / "srt" / "observability").mkdir()
    (tmp_path / "sglang" / "srt" / "observability" / "req_time_stats.py").write_text("")
    (managers / "tokenizer_manager.py").write_text(
        "class TokenizerManager:\n    async def _handle_batch_output(self, recv_obj):\n"
        + "".join(f"        {line}\n" for line in handler_body.splitlines()))
    return sglang_source.from_directory(tmp_path, version="9.9.9")


def test_a_condition_the_table_does_not_know_is_named_and_its_keys_left_out(tmp_path):
    source = _fake_release(tmp_path, 'meta_info = {"id": 1}\n'
                                     "if self.new_feature_flag:\n"
                                     '    meta_info["novel"] = 2\n'
                                     "if self.enable_metrics:\n"
                                     '    meta_info["kept"] = 3\n'
                                     'out_dict = {"text": "", "meta_info": meta_info}')
    keys = answer_keys(source)
    assert keys.meta == ("id", "kept") and keys.top == ("text", "meta_info")
    [unread] = keys.unread
    assert "tokenizer_manager.py:4" in unread and "self.new_feature_flag" in unread


def test_a_helper_handed_meta_info_is_named_not_followed(tmp_path):
    source = _fake_release(tmp_path, 'meta_info = {"id": 1}\nself.add_more(meta_info, recv_obj)\n'
                                     'out_dict = {"text": "", "meta_info": meta_info}')
    [unread] = answer_keys(source).unread
    assert "self.add_more(...) is handed meta_info" in unread


def test_short_circuit_conditions_read_as_python_reads_them(tmp_path):
    # ``image_tokens_list and image_tokens_list[i]``: a false first part decides; the second is never asked
    source = _fake_release(tmp_path, 'meta_info = {"id": 1}\n'
                                     "if image_tokens_list and image_tokens_list[i]:\n"
                                     '    meta_info["image_tokens"] = 1\n'
                                     'out_dict = {"text": "", "meta_info": meta_info}')
    keys = answer_keys(source)
    assert keys.unread == () and keys.meta == ("id",)


def test_the_twins_body_has_exactly_the_keys_and_its_own_instrumentation():
    keys = answer_keys(sglang_source.fetch("0.5.15"))
    request = wire.parse("/generate", {"text": "a b c d", "sampling_params": {"max_new_tokens": 8}})
    body = wire.final_response(request, " tok0", {"kv_intact": True}, keys)
    assert set(body) == set(REAL)
    assert set(body["meta_info"]) == set(REAL["meta_info"]) | {"kv_intact"}
    assert body["output_ids"] == list(range(8)) and body["meta_info"]["completion_tokens"] == 8
    for key, value in REAL["meta_info"].items():  # the same JSON types as the real answer's
        assert type(body["meta_info"][key]) is type(value), key
    bare = wire.final_response(request, " tok0", {}, AnswerKeys("x", (), ()))
    assert set(bare) == {"text", "meta_info"}  # no keys read: the twin's own body, as before

