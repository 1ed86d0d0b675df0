"""No planted secret survives a real collection, its diagnosis and its report (issue 19, item 8).

Thirty distinct random values are planted in every source a collection reads: the inventory
(a log command's argv, an engine URL's userinfo and query), a log file's lines, the
/server_info body of a real HTTP server on 127.0.0.1, the environment and the command line
of the real process standing for each engine. Then ``forensics collect``, ``diagnose
--bundle --json`` and ``report`` run as child processes, and every byte they wrote (the
Parquet frames decoded with pyarrow, the manifest, the JSON, the report files, stdout and
stderr) is searched for every value.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from cli_helpers import run_forensics
from fake_engine_helpers import FakeEngine, SleepingProcess, local_inventory

NAMES = [
    "log_command_api_key", "log_command_token", "url_user_token", "url_password", "url_query_token",
    "log_token", "log_bearer", "log_api_key", "log_hf_shape", "log_password", "log_url_user",
    "info_api_key", "info_admin_api_key", "info_hf_token", "info_url_user", "info_url_password",
    "info_url_query", "info_nested_secret",
    "env_hf_token", "env_sglang_api_key", "env_ucx_url_user", "env_mooncake_url_password", "env_auth",
    "argv_api_key", "argv_admin_api_key", "argv_hf_token", "argv_model_url_user", "argv_url_query",
    "argv_env_style", "argv_bearer",
]


def _planted() -> dict[str, str]:
    values = {name: f"Qz{secrets.token_hex(10)}Wv" for name in NAMES}
    values["log_hf_shape"] = "hf_" + secrets.token_hex(12)  # a token by its shape alone
    assert len(set(values.values())) == len(NAMES) == 30
    return values


def _log_lines(s: dict[str, str]) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    failed = f"[{now} TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r{{n}}' bootstrap_room={{n}}"
    return "\n".join([
        failed.format(n=1) + f" with exception KVTransferError: retry(token={s['log_token']}) "
        f"Authorization: Bearer {s['log_bearer']}",
        failed.format(n=2) + f" with exception KVTransferError: api_key={s['log_api_key']} {s['log_hf_shape']}",
        failed.format(n=3) + f" with exception KVTransferError: password: {s['log_password']} "
        f"from https://{s['log_url_user']}@hub.example.com/x",
    ]) + "\n"


def _server_info(s: dict[str, str], role: str) -> dict:
    return {
        "version": "0.5.15", "disaggregation_mode": role, "disaggregation_transfer_backend": "nixl",
        "api_key": s["info_api_key"], "admin_api_key": s["info_admin_api_key"], "hf_token": s["info_hf_token"],
        "model_path": f"https://{s['info_url_user']}@hub.example.com/models/m",
        "disaggregation_bootstrap_url": f"http://ops:{s['info_url_password']}@10.0.0.1:8998/",
        "tokenizer_path": f"https://hub.example.com/t?access_token={s['info_url_query']}",
        "internal_states": [{"client_secret": s["info_nested_secret"], "token_capacity": 4096}],
        "token_capacity": 4096, "ds_heavy_token_num": 256, "tbo_token_distribution_threshold": 0.48,
    }


def _engine_process(s: dict[str, str], pid_file: Path) -> SleepingProcess:
    env = {**os.environ, "HF_TOKEN": s["env_hf_token"], "SGLANG_API_KEY": s["env_sglang_api_key"],
           "UCX_SOCKADDR_URL": f"http://{s['env_ucx_url_user']}@10.0.0.2/",
           "MOONCAKE_MASTER": f"http://u:{s['env_mooncake_url_password']}@10.0.0.3:50051",
           "SGLANG_DISAGGREGATION_AUTH": s["env_auth"]}
    argv = ["-m", "sglang.launch_server", "--api-key", s["argv_api_key"], f"--admin-api-key={s['argv_admin_api_key']}",
            "--hf-token", s["argv_hf_token"], "--model-path", f"https://{s['argv_model_url_user']}@hub.example.com/m",
            "--weights-url", f"http://hub.example.com/w?token={s['argv_url_query']}",
            f"HF_TOKEN={s['argv_env_style']}", "--header", f"Authorization: Bearer {s['argv_bearer']}"]
    return SleepingProcess(argv, env, pid_file)


def _decoded(folder: Path) -> str:
    """Every file under ``folder`` as text: Parquet decoded (rows and schema metadata), the rest as bytes."""
    parts = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        parts.append(path.read_bytes().decode("utf-8", "replace"))
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            parts.append(json.dumps(table.to_pylist(), default=str))
            parts.append(str(table.schema.metadata))
    return "\n".join(parts)


def _survivors(values: dict[str, str], text: str) -> list[str]:
    return sorted(name for name, value in values.items() if value in text)


@pytest.mark.timeout(600)
def test_no_planted_secret_survives_collect_diagnose_and_report(tmp_path):
    s = _planted()
    processes = {role: _engine_process(s, tmp_path / f"{role}.pid") for role in ("prefill", "decode")}
    (tmp_path / "prefill.log").write_text(_log_lines(s))
    logs = {"prefill": {"file": str(tmp_path / "prefill.log")},
            "decode": {"command": ["sh", "-c", "echo no such container >&2; exit 3", "sh",
                                   f"--api-key={s['log_command_api_key']}", "--token", s["log_command_token"]]}}
    pid_files = {role: tmp_path / f"{role}.pid" for role in processes}
    written: list[str] = []
    try:
        with FakeEngine() as engine:
            engine.server_info = _server_info(s, "prefill")
            port = engine.server.server_address[1]
            secret_url = (f"http://{s['url_user_token']}:{s['url_password']}@127.0.0.1:{port}/"
                          f"?token={s['url_query_token']}")
            inventory = local_inventory(tmp_path / "inventory.toml", engine, logs=logs, pid_files=pid_files,
                                        url=secret_url)
            bundle = tmp_path / "bundle"
            collect = run_forensics("collect", "--inventory", str(inventory), "--out", str(bundle),
                                    "--sample", "2s", "--json")
            written += [collect.stdout, collect.stderr]
            if collect.returncode == 4 and "inventory" in collect.stderr:
                # The loader refuses a URL with a userinfo or query (exit 4 naming file and field): collect
                # again with the plain URL; the refusal's own words were searched above.
                assert "inventory.toml" in collect.stderr and "engine[0].url" in collect.stderr, collect.stderr
                inventory = local_inventory(tmp_path / "inventory.toml", engine, logs=logs, pid_files=pid_files)
                collect = run_forensics("collect", "--inventory", str(inventory), "--out", str(bundle),
                                        "--sample", "2s", "--json")
                written += [collect.stdout, collect.stderr]
            assert collect.returncode in (0, 3), collect.stderr
            diagnosis = run_forensics("diagnose", "--bundle", str(bundle), "--json")
            written += [diagnosis.stdout, diagnosis.stderr]
            assert diagnosis.returncode in (0, 1, 3), diagnosis.stderr
        investigation = tmp_path / "investigation"
        script = ("import sys, forensics as fx; from forensics.report import Investigation\n"
                  "inv = Investigation(sys.argv[1], target='local-fake', release='0.5.15', backend='nixl')\n"
                  "inv.add_bundle(sys.argv[2]); inv.add_verdict(fx.diagnose(bundle=sys.argv[2]))\n")
        import subprocess

        built = subprocess.run([sys.executable, "-c", script, str(investigation), str(bundle)],
                               capture_output=True, text=True, timeout=300)
        written += [built.stdout, built.stderr]
        assert built.returncode == 0, built.stderr
        report = run_forensics("report", "--investigation", str(investigation), "--out", str(tmp_path / "report"),
                               "--format", "md,html", "--json")
        written += [report.stdout, report.stderr]
        assert report.returncode == 0, report.stderr
    finally:
        for process in processes.values():
            process.close()
    everything = "\n".join([*written, _decoded(bundle), _decoded(investigation), _decoded(tmp_path / "report")])
    # The evidence is there, only its secrets are not: the planted sources were all read.
    assert "Decode transfer failed" in everything and "sglang.launch_server" in everything
    assert "<redacted>" in everything
    survived = _survivors(s, everything)
    print(f"planted {len(s)} secrets, {len(survived)} survived: {survived}")
    assert survived == [], f"{len(survived)} of {len(s)} planted secrets survived: {survived}"
    # issue 21's false positives: numeric settings whose names hold "token" keep their values
    info = json.dumps(pq.read_table(bundle / "frames" / "server_info.parquet").to_pylist())
    assert '\\"token_capacity\\": 4096' in info and '\\"ds_heavy_token_num\\": 256' in info, info[:2000]


@pytest.mark.parametrize(("url", "what"), [
    ("http://127.0.0.1:30000/?token=QzQueryWv", "a query or fragment has no place"),
    ("http://127.0.0.1:30000/v1?token=QzQueryWv", "a query or fragment has no place"),
    ("http://QzUserWv@127.0.0.1:30000", "a user or password in the URL is a credential"),
    ("http://ops:QzPassWv@127.0.0.1:30000", "a user or password in the URL is a credential"),
    ("http://127.0.0.1:30000/generate", "an engine URL is http(s)://host[:port], without a path"),
    ("http://127.0.0.1:30000#QzFragWv", "a query or fragment has no place"),
])
def test_the_loader_refuses_engine_urls_with_a_path_query_or_userinfo_naming_file_and_field(tmp_path, url, what):
    from forensics.inventory import InventoryError, load

    with FakeEngine() as engine:
        path = local_inventory(tmp_path / "inventory.toml", engine, url=url)
    with pytest.raises(InventoryError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:") and "engine[0].url" in message and what in message, message
    assert "Qz" not in message  # the refusal does not print the credential it refuses


def test_prometheus_may_sit_behind_a_path_prefix_but_never_with_a_query(tmp_path):
    from forensics.inventory import InventoryError, load

    with FakeEngine() as engine:
        path = local_inventory(tmp_path / "inventory.toml", engine)
    text = path.read_text().replace('backend = "nixl"', 'backend = "nixl"\nprometheus = "http://prom:9090/prom/"')
    path.write_text(text)
    assert load(path).prometheus == "http://prom:9090/prom"
    path.write_text(text.replace("/prom/", "/prom?token=QzWv"))
    with pytest.raises(InventoryError, match=r"deployment\.prometheus: .http://prom:9090/prom\?<redacted>."):
        load(path)


@pytest.mark.parametrize("name", ["token_capacity", "ds_heavy_token_num", "tbo_token_distribution_threshold",
                                  "max_total_tokens", "num_reserved_decode_tokens", "tokenizer_path"])
def test_numeric_settings_named_after_tokens_are_not_secrets(name):
    from forensics.redact import is_secret_name, redact_env, redact_text, redact_value

    assert not is_secret_name(name)
    assert redact_value({name: 4096}) == {name: 4096} and redact_env({name: "0.48"}) == {name: "0.48"}
    assert redact_text(f"--{name.replace('_', '-')} 256 {name}=256") == f"--{name.replace('_', '-')} 256 {name}=256"


@pytest.mark.parametrize("name", ["token", "HF_TOKEN", "hf_token", "access_token", "GITHUB_TOKEN", "api_key", "auth",
                                  "password", "secret", "apiToken", "x-auth-token", "bearer"])
def test_secret_shaped_names_still_are(name):
    from forensics.redact import REDACTED, is_secret_name, redact_value

    assert is_secret_name(name) and redact_value({name: "QzWv"}) == {name: REDACTED}


@pytest.mark.parametrize("text", [
    "KVTransferError: retry(token=QzSecretWv)",
    "KVTransferError: api_key=QzSecretWv",
    "error: password: QzSecretWv",
    "see https://QzSecretWv@hub.example.com/x",
    "see https://QzSecretWv:x-oauth-basic@github.com/x",
])
def test_a_secret_inside_an_innocent_pairs_value_is_found(text):
    from forensics.redact import redact_text

    assert "QzSecretWv" not in redact_text(text), redact_text(text)
