"""``forensics engine prepare``: what ``./run test`` calls before pytest, and what an operator runs first."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import invoke


def test_a_release_with_no_engine_environment_is_a_usage_error_naming_what_runs():
    status, out, err = invoke("engine", "prepare", "0.5.12", "--json")
    assert status == 2
    doc = json.loads(out)
    assert doc["exit"] == 2 and doc["status"] == "usage"
    assert "0.5.12" in doc["error"] and "0.5.15" in doc["error"]


def test_an_unknown_model_size_is_a_usage_error():
    status, _out, err = invoke("engine", "prepare", "--model", "huge")
    assert status == 2
    assert "huge" in err


@pytest.mark.engine
@pytest.mark.slow  # builds the environment when ./run test has not (CI does not yet)
def test_a_prepared_environment_is_verified_and_named_with_its_models():
    # ./run test has built it before pytest; here it is verified (about 0.1 s) and reported.
    status, out, _err = invoke("engine", "prepare", "0.5.15", "--model", "tiny", "--json")
    assert status == 0, out
    doc = json.loads(out)
    (env,) = doc["environments"]
    assert env["release"] == "0.5.15" and env["python"].endswith("/venv/bin/python")
    assert env["steps"] == {}  # reused, nothing rebuilt
    (model,) = doc["models"]
    assert model["size"] == "tiny" and model["parameters"] == 1_179_968
