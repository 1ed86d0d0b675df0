"""The exit contract, command by command and failure class by failure class.

0 good, 1 bad, 2 usage, 3 inconclusive, 4 environment (one stderr line naming the path),
5 internal error (one stderr line naming the saved traceback). With ``--json`` stdout
holds exactly one JSON document on every exit, with ``status`` and ``exit`` on top, and
``error`` and ``kind`` when it ended in an error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from forensics.exitcodes import ExitStatus
from tests.cli_helpers import invoke

ROOM = 7461092837465012345


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    log = root / "decode.log"
    log.write_text(
        "[2025-07-01 12:00:00 TP0] Decode batch, #running-req: 1, #token: 10, token usage: 0.00, "
        "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, cuda graph: True, "
        "gen throughput (token/s): 1.00, #queue-req: 0\n"
        f"[2025-07-01 12:00:01 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='ab' "
        f"decode_req.req.bootstrap_room={ROOM} with exception KVTransferError(bootstrap_room={ROOM}): "
        f"Request {ROOM} timed out after 300.0s in KVPoll.WaitingForInput\n")
    noise = root / "noise.log"
    noise.write_bytes(bytes(range(256)) * 4000)
    not_twin = root / "live.toml"
    not_twin.write_text('[deployment]\nname = "pd-prod-7"\nbackend = "nixl"\n')
    empty_dir = root / "empty"
    empty_dir.mkdir()
    return {"log": str(log), "noise": str(noise), "missing": str(root / "missing.log"),
            "not_twin": str(not_twin), "missing_toml": str(root / "missing.toml"), "empty_dir": str(empty_dir),
            "unwritable": "/proc/pd-forensics-cannot-write/out.csv", "missing_conn": str(root / "nope" / "conn.py"),
            "unwritable_png": "/proc/pd-forensics-cannot-write/m.png", "unwritable_dir": "/proc/pd-forensics-cannot-write",
            "missing_dir": str(root / "missing-tree")}


# (command line with {placeholders}, expected status, text stderr must hold (None: nothing in particular))
CASES = [
    # logs
    ("logs {log}", 1, None),
    ("logs {noise}", 3, None),
    ("logs {missing}", 4, "missing.log"),
    ("logs {log} --csv {unwritable}", 4, "pd-forensics-cannot-write"),
    ("logs", 2, "Missing argument"),
    ("logs {log} --tz Mars/Olympus", 2, "Mars/Olympus"),
    ("logs {log} --since ''", 2, "--since is empty"),
    ("logs {log} --since 2025-07-02 --until 2025-07-01", 2, "before --since"),
    # patch
    ("patch diff", 2, "--sglang"),
    ("patch diff --sglang {empty_dir}", 4, "empty"),
    ("patch apply --file {missing_conn}", 4, "conn.py"),
    # handlers
    ("handlers check", 2, "--source"),
    ("handlers check --source {missing_dir}", 4, "missing-tree"),
    ("handlers diff --sglang {empty_dir}", 4, "empty"),
    ("handlers matrix --from 0.5.99 --to 0.5.99", 2, "no sglang release"),
    ("handlers matrix --from 0.5.15 --to 0.5.15 --png {unwritable_png}", 4, "pd-forensics-cannot-write"),
    ("patch verify --sglang {empty_dir}", 4, "empty"),
    ("patch verify --sglang 0.5.99", 4, "0.5.99"),
    # twin
    ("twin status --inventory {missing_toml}", 4, "missing.toml"),
    ("twin status --inventory {not_twin}", 4, "live.toml"),
    ("twin restart prefill --inventory {not_twin}", 4, "live.toml"),
    ("twin down --inventory {missing_toml}", 4, "missing.toml"),
    ("twin status", 2, "--inventory"),
    # upgrade-order
    ("upgrade-order --from 0.5.16", 2, "--to"),
    ("upgrade-order --from 0.5.16 --to 0.5.16", 2, "nothing to upgrade"),
    ("upgrade-order --from 0.5.99 --to 0.5.16", 4, "0.5.99"),
    # durations: a sign is a usage error naming the option, never read as its absolute value
    ("storm --inventory {not_twin} --kill-after -1s", 2, "--kill-after '-1s': a duration has no sign"),
    ("storm --inventory {not_twin} --kill-after=-20s", 2, "--kill-after '-20s'"),
    ("storm --inventory {not_twin} --session-timeout -5s", 2, "--session-timeout '-5s'"),
    ("storm --inventory {not_twin} --settle -3s", 2, "--settle '-3s'"),
    ("storm --inventory {not_twin} --wave-interval -1s", 2, "--wave-interval '-1s'"),
    ("storm --inventory {not_twin} --sample -8s", 2, "--sample '-8s'"),
    ("validate --inventory {not_twin} --kill-after -1s", 2, "--kill-after '-1s'"),
    ("validate --inventory {not_twin} --liveness-deadline -1m", 2, "--liveness-deadline '-1m'"),
    ("validate --inventory {not_twin} --probe-deadline -2s", 2, "--probe-deadline '-2s'"),
    ("watch --inventory {not_twin} --interval -1s", 2, "--interval '-1s'"),
    ("watch --inventory {not_twin} --for -10m", 2, "--for '-10m'"),
    ("collect --inventory {not_twin} --out {empty_dir}/b --sample -8s", 2, "--sample '-8s'"),
    ("patch deploy --inventory {not_twin} --liveness-deadline -5", 2, "--liveness-deadline"),
    ("patch rollback --inventory {not_twin} --liveness-deadline -5", 2, "--liveness-deadline"),
    # demo
    ("demo --no-such-option", 2, "no-such-option"),
    ("demo --out {unwritable_dir}", 4, "pd-forensics-cannot-write"),
]


def _argv(template: str, files: dict) -> list[str]:
    import shlex

    return [part for part in shlex.split(template.format(**files))]


@pytest.mark.parametrize("template,expected,stderr_text", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_every_command_keeps_the_contract(files, template, expected, stderr_text, as_json):
    argv = _argv(template, files)
    if as_json:
        argv.append("--json")
    status, stdout, stderr = invoke(*argv)
    assert status == expected, (stdout[-800:], stderr)
    if stderr_text:
        assert stderr_text in stderr, stderr
    if expected == ExitStatus.ENVIRONMENT:
        # one line that names the path
        lines = [line for line in stderr.splitlines() if line.startswith("forensics")]
        assert len(lines) == 1, stderr
    if as_json:
        document = json.loads(stdout)  # exactly one document: json.loads refuses trailing data
        assert document["exit"] == expected
        assert isinstance(document["status"], str) and document["status"]
        if expected in (ExitStatus.USAGE, ExitStatus.ENVIRONMENT, ExitStatus.INTERNAL):
            assert document["error"] and "\n" not in document["error"]
            assert document["kind"]
    elif expected in (ExitStatus.USAGE, ExitStatus.ENVIRONMENT):
        assert stdout == "" or not stdout.lstrip().startswith("{")


def test_the_scan_is_kept_when_the_csv_cannot_be_written(files):
    status, stdout, stderr = invoke("logs", files["log"], "--csv", files["unwritable"], "--json")
    assert status == 4
    document = json.loads(stdout)
    assert document["status"] == "error" and document["kind"] == "EnvironmentProblem"
    assert files["unwritable"] in document["error"]
    assert [e["room"] for e in document["events"]] == [str(ROOM)]  # what was computed is still there
    status, stdout, stderr = invoke("logs", files["log"], "--csv", files["unwritable"])
    assert status == 4 and "request_timeouts" in stdout  # the human output too


@pytest.mark.parametrize("argv,target", [
    (["logs", "{log}"], "forensics.logs.scan"),
    (["demo"], "forensics.demo.run"),
    (["patch", "verify", "--sglang", "0.5.15"], "patched_engine.verify.verify_release"),
    (["twin", "status", "--inventory", "{not_twin}"], "forensics.twin.api.attach"),
])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_bug_is_exit_5_with_the_traceback_saved(files, monkeypatch, tmp_path, argv, target, as_json):
    monkeypatch.setenv("PD_FORENSICS_CACHE", str(tmp_path))
    module_name, attribute = target.rsplit(".", 1)
    module = __import__(module_name, fromlist=[attribute])

    def broken(*args, **kwargs):
        raise ValueError("an internal bug, not the user's input")

    monkeypatch.setattr(module, attribute, broken)
    args = [a.format(**files) for a in argv] + (["--json"] if as_json else [])
    status, stdout, stderr = invoke(*args)
    assert status == 5, stderr
    (line,) = stderr.strip().splitlines()
    saved = Path(re.search(r"traceback saved to (\S+)", line).group(1))
    assert saved.parent == tmp_path / "crash"
    assert "ValueError: an internal bug" in saved.read_text() and "Traceback" in saved.read_text()
    if as_json:
        document = json.loads(stdout)
        assert document == {"status": "error", "exit": 5, "error": line.removeprefix("forensics: "),
                            "kind": "ValueError"}
    else:
        assert stdout == ""


def test_help_is_not_an_error():
    status, stdout, _ = invoke("--help")
    assert status == 0 and "logs" in stdout


@pytest.mark.parametrize("text", ["-1s", "+1s", "-0.5m", "- 2h"])
def test_a_signed_duration_is_a_usage_problem(text, tmp_path):
    from forensics.exitcodes import UsageProblem
    from forensics.inventory.twin_table import TwinSettings
    from forensics.logs.timewindow import parse_duration
    from forensics.storm.runner import make_plan
    from forensics.twin.api import build_inventory

    with pytest.raises(UsageProblem, match="--kill-after .*a duration has no sign"):
        parse_duration(text, "--kill-after")
    settings = TwinSettings(directory=str(tmp_path), sglang="0.5.15", sglang_root=str(tmp_path / "site-packages"))
    inventory = build_inventory(settings, tmp_path / "inventory.toml")
    for option in ("kill_after", "settle", "session_timeout"):
        with pytest.raises(UsageProblem, match="a duration has no sign"):
            make_plan(inventory, **{option: text})
