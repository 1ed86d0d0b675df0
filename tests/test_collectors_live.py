"""Engine processes, engine state endpoints, versions and settings, and secret redaction, for real.

Real local processes (a launcher with secrets in its argv and environment, and two
"scheduler" children that retitle themselves with setproctitle, as sglang's do), one
module-scoped twin for ``/server_info`` and ``/v1/loads``, the session sshd for the same
reads over SSH (and a permission-denied ``/proc/PID/environ`` as an unprivileged user),
and property tests that no secret value survives in any output of the collectors.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from http_helpers import RoutesServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forensics.twin as twin_api
from forensics.collectors import engine_state as es
from forensics.collectors import processes as pc
from forensics.collectors import settings as sc
from forensics.hosts import LocalHost
from forensics.redact import REDACTED, is_secret_name, redact_argv, redact_env, redact_text, redact_value

MARKER = f"pdfxcoll{uuid.uuid4().hex[:10]}"
SECRET_ARG = "sEcRargv" + uuid.uuid4().hex[:12]
SECRET_HF = "hf_" + uuid.uuid4().hex + "Zz"
SECRET_KEPT = "sEcRkept" + uuid.uuid4().hex[:12]  # a PD variable with a secret-looking name
SECRET_AWS = "sEcRaws" + uuid.uuid4().hex[:12]
SECRETS = (SECRET_ARG, SECRET_HF, SECRET_KEPT, SECRET_AWS)
TITLE = f"sglang::scheduler_{MARKER}"

# The launcher starts one child per title; each child retitles itself, says "ready" and waits for EOF.
LAUNCHER = r"""
import subprocess, sys
CHILD = "import setproctitle, sys; setproctitle.setproctitle(sys.argv[1]); print('ready', flush=True); sys.stdin.read()"
titles = [a for a in sys.argv[1:] if a.startswith("sglang::")]
kids = [subprocess.Popen([sys.executable, "-c", CHILD, t], stdin=subprocess.PIPE, stdout=subprocess.PIPE) for t in titles]
for k in kids:
    assert k.stdout.readline().strip() == b"ready"
print("ready", flush=True)
sys.stdin.read()
for k in kids:
    k.stdin.close()
for k in kids:
    k.wait(30)
"""


class Engine:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.children = sorted(c.pid for c in psutil.Process(proc.pid).children())


@pytest.fixture(scope="module")
def engine(leak_guard):
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HF_TOKEN": SECRET_HF,
        "AWS_SECRET_ACCESS_KEY": SECRET_AWS,
        "MOONCAKE_AUTH_TOKEN": SECRET_KEPT,
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "3600",
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "300",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "120",
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
        "UCX_TLS": "tcp,self",
        "NIXL_PLUGIN_DIR": f"http://ops:{SECRET_ARG}@plugins.example/nixl",
        "SOMETHING_ELSE": "dropped",
    }
    argv = [sys.executable, "-c", LAUNCHER, "--api-key", SECRET_ARG, "--model-path", "m", MARKER,
            f"{TITLE}_TP0", f"{TITLE}_TP1"]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready and proc.stdout.readline().strip() == b"ready"
    leak_guard.allow(proc.pid)
    yield Engine(proc)
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(30)


def _outputs(*objects) -> str:
    """Everything a collector result shows: repr, str, to_dict/JSON, frames, HTML."""
    parts = []
    for obj in objects:
        parts += [repr(obj), str(obj)]
        if hasattr(obj, "to_dict"):
            parts.append(json.dumps(obj.to_dict(), default=str))
        if hasattr(obj, "to_frame"):
            parts.append(obj.to_frame().to_csv())
        if hasattr(obj, "_repr_html_"):
            parts.append(obj._repr_html_())
        for name in ("gaps", "processes", "findings", "commands", "requests"):
            parts += [repr(x) for x in getattr(obj, name, [])]
    return "\n".join(parts)


def _assert_no_secret(text: str, secrets=SECRETS) -> None:
    for secret in secrets:
        assert secret not in text


# ------------------------------------------------------------------------------------- processes


def test_title_finds_every_rank_with_exact_start_time(engine):
    scan = pc.find_processes(LocalHost(), pc.ProcessSelector(title=TITLE))
    assert not scan.gaps, scan.gaps
    assert sorted(scan.pids()) == engine.children
    for info in scan:
        assert info.title.startswith(TITLE) and info.ppid == engine.pid
        assert info.start_time.tz is not None
        # psutil's create_time counts from btime, cut to the second: it may be up to 1 s early.
        assert -0.02 < info.start_time.timestamp() - psutil.Process(info.pid).create_time() < 1.02
    frame = scan.to_frame()
    assert list(frame.columns) == list(pc.PROCESSES_SCHEMA)
    assert {c: str(t) for c, t in frame.dtypes.items()} == pc.PROCESSES_SCHEMA


def test_start_time_is_the_wall_clock_of_the_fork_to_a_clock_tick():
    """Not cut to the boot second (``btime``), which put it up to a second early: the diagnosis
    compares it with log lines to tell this run's failures from the last run's."""
    title = f"sglang::clock_{MARKER}"
    child = "import setproctitle, sys; setproctitle.setproctitle(sys.argv[1]); print('ready', flush=True); sys.stdin.read()"
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", child, title], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    after = time.time()
    try:
        assert proc.stdout.readline().strip() == b"ready"
        scan = pc.find_processes(LocalHost(), pc.ProcessSelector(title=title))
        assert scan.pids() == [proc.pid], scan.gaps
        started = scan.processes[0].start_time.timestamp()
        tick = 1 / os.sysconf("SC_CLK_TCK")
        # Two clock ticks of slack: the start's own tick and /proc/uptime's 10 ms steps.
        assert before - 2 * tick <= started <= after + 2 * tick, (before, started, after)
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_cmdline_selector_redacts_the_argv(engine):
    scan = pc.find_processes(LocalHost(), pc.ProcessSelector(cmdline=f"m {MARKER}"))
    assert scan.pids() == [engine.pid], scan  # not the lookup itself, whose argv is hex
    cmd = scan.processes[0].cmdline
    assert cmd[cmd.index("--api-key") + 1] == REDACTED and MARKER in cmd
    _assert_no_secret(_outputs(scan))


def test_no_match_is_a_gap_naming_selector_and_host():
    host = LocalHost()
    scan = pc.find_processes(host, pc.ProcessSelector(title=f"sglang::nothing_{MARKER}"))
    assert not scan.found and len(scan.gaps) == 1
    gap = scan.gaps[0]
    assert gap.piece == "processes"
    assert gap.reason == f"no process matching title='sglang::nothing_{MARKER}' on {host.name}"


def test_pid_file(engine, tmp_path):
    good = tmp_path / "engine.pid"
    good.write_text(f"{engine.pid}\n")
    scan = pc.find_processes(LocalHost(), pc.ProcessSelector(pid_file=str(good)))
    assert scan.pids() == [engine.pid]
    both = pc.find_processes(LocalHost(), pc.ProcessSelector(pid_file=str(good), title="no-such-title"))
    assert not both.found and "does not match" in both.gaps[0].reason
    missing = pc.find_processes(LocalHost(), pc.ProcessSelector(pid_file=str(tmp_path / "absent.pid")))
    assert not missing.found and "pid file unreadable" in missing.gaps[0].reason


def test_found_again_only_with_same_start_and_cmdline(engine):
    host = LocalHost()
    info = pc.find_processes(host, pc.ProcessSelector(title=f"{TITLE}_TP0")).processes[0]
    again = pc.find_again(host, info)
    assert again is not None and again.same_process(info)
    from dataclasses import replace

    reused = replace(info, start_ticks=info.start_ticks + 1)  # same pid, another process (pid reuse)
    assert pc.find_again(host, reused) is None
    assert pc.find_again(host, replace(info, cmdline=("python3", "other"))) is None


def test_ps_fallback_without_python(engine):
    scan = pc.find_processes(LocalHost(), pc.ProcessSelector(cmdline=f"--model-path m {MARKER}"),
                             python=f"no-python-{MARKER}")
    assert scan.source == "ps" and scan.pids() == [engine.pid], scan
    info = scan.processes[0]
    assert info.start_ticks is None
    assert abs(info.start_time.timestamp() - psutil.Process(engine.pid).create_time()) < 1.01
    _assert_no_secret(_outputs(scan))


# -------------------------------------------------------------------------------------- settings


def test_settings_of_a_retitled_scheduler_read_the_parent_env(engine):
    host = LocalHost()
    child = pc.find_processes(host, pc.ProcessSelector(title=f"{TITLE}_TP0")).processes[0]
    alone = sc.collect_settings("decode", host=host, pid=child.pid)  # setproctitle blanked its environ
    assert not alone.engines["decode"]["env_read"]
    assert any("is blank" in g.reason for g in alone.gaps)
    s = sc.collect_settings("decode", host=host, pid=child.pid, ppid=child.ppid, backend="nixl")
    assert s.engines["decode"]["env_pid"] == engine.pid
    frame = s.to_frame()
    assert {c: str(t) for c, t in frame.dtypes.items()} == sc.SETTINGS_SCHEMA
    env = dict(zip(frame.loc[frame.source == "env", "name"], frame.loc[frame.source == "env", "value"]))
    assert env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "3600"
    assert env["MOONCAKE_AUTH_TOKEN"] == REDACTED  # kept, so the reader knows it is set
    assert env["NIXL_PLUGIN_DIR"] == f"http://{REDACTED}@plugins.example/nixl"  # the whole userinfo of an http URL
    assert "HF_TOKEN" not in env and "SOMETHING_ELSE" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    ids = {f.id for f in s.findings}
    assert {"pd_timeout_high", "health_check_timeout_high", "health_generation_disabled"} <= ids
    risky = set(frame.loc[frame.risky, "name"])
    assert risky == {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "SGLANG_HEALTH_CHECK_TIMEOUT",
                     "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"}
    assert any("hang" in f.why for f in s.findings if f.id == "pd_timeout_high")
    _assert_no_secret(_outputs(s) + s.to_json())


def test_version_from_the_engines_interpreter(tmp_path):
    site = tmp_path / "site"
    dist = site / "sglang-0.5.14.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.14\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    s = sc.collect_settings("prefill", host=LocalHost(), python=str(python), backend="nixl")
    assert s.version("prefill") == "0.5.14" and s.engines["prefill"]["version_source"] == "python"
    assert [f.id for f in s.findings] == ["vulnerable_release"]
    missing = sc.collect_settings("prefill", host=LocalHost(), python=str(tmp_path / "nope"))
    assert missing.version("prefill") is None and any("version unknown" in g.reason for g in missing.gaps)


# ---------------------------------------------------------------------------------- engine state


@pytest.fixture(scope="module")
def twin(tmp_path_factory, leak_guard):
    deployment = twin_api.up("0.5.15", waiting_timeout=15, directory=tmp_path_factory.mktemp("t"),
                             prefill_rate_tps=400.0, decode_rate_tps=50.0, decode_log_interval=10)
    for role in ("prefill", "decode", "router"):
        leak_guard.allow(deployment.pid(role))
    yield deployment
    deployment.down()


@pytest.mark.server
def test_twin_server_info_and_loads(twin):
    state = es.read_engine_state(twin.prefill, engine="prefill")
    assert state.status == {"server_info": "ok", "loads": "ok"} and not state.gaps, state.gaps
    assert state.version == "0.5.15" and state.backend == "nixl"
    assert state.internal_states and "twin" in state.internal_states[0]
    frame = state.loads  # 0.5.15 serves /v1/loads (v1_loads.py:72); the twin answers it from its queues
    assert {c: str(t) for c, t in frame.dtypes.items()} == es.LOADS_SCHEMA
    assert frame["mode"].tolist() == ["prefill"] and frame["prefill_bootstrap_queue_reqs"].tolist() == [0]
    # A route 0.5.15 does not register is 404 on the twin too: the collector says "not served".
    missing = es._first(twin.prefill, ("/no_such_route",), {}, [], es.JSON_LIMITS)
    assert missing[0] == "not_served"


@pytest.mark.server
def test_twin_settings_flag_the_vulnerable_release(twin):
    host = LocalHost()
    state = es.read_engine_state(twin.prefill, engine="prefill")
    pid = twin.scheduler_pid("prefill")  # the inventory's process, as collect finds it
    ppid = psutil.Process(pid).ppid()
    s = sc.collect_settings("prefill", host=host, state=state, pid=pid, ppid=ppid)
    assert s.version("prefill") == "0.5.15" and s.backend("prefill") == "nixl"
    (finding,) = [f for f in s.findings if f.id == "vulnerable_release"]
    assert finding.severity == "critical" and "sglang=0.5.15" in finding.evidence
    frame = s.to_frame()
    assert frame.loc[(frame.source == "version") & (frame.name == "sglang"), "risky"].tolist() == [True]
    assert frame.loc[frame.name == "disaggregation_transfer_backend", "value"].tolist() == ["nixl"]


def test_unreachable_engine():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = es.read_engine_state(f"http://127.0.0.1:{port}", engine="decode", timeout=3)
    assert state.status == {"server_info": "unreachable", "loads": "unreachable"}
    assert all(g.state == "unreachable" and "unreachable" in g.reason for g in state.gaps)


@pytest.fixture(scope="module")
def engine_http():
    """``serve(routes)``: a real HTTP server on 127.0.0.1 answering ``routes``; its host:port.

    One server for the module: the property test below asks it 150 times."""
    with RoutesServer({}) as server:
        def serve(routes: dict[str, tuple[int, str]]) -> str:
            server.routes = dict(routes)
            return server.url.removeprefix("http://")
        yield serve


LOADS_0515 = {  # the shape of sglang 0.5.15's /v1/loads?include=disagg (load_snapshot.to_dict)
    "timestamp": "2026-11-30T03:00:00+00:00", "version": "0.5.15",
    "loads": [
        {"dp_rank": r, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0,
         "num_used_tokens": 0, "num_total_tokens": 0, "max_total_num_tokens": 786432, "max_running_requests": 4096,
         "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0,
         "disaggregation": {"mode": "prefill", "prefill_bootstrap_queue_reqs": 9223372036854775807 - r,
                            "prefill_inflight_queue_reqs": 3, "decode_prealloc_queue_reqs": 0,
                            "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                            "kv_transfer_speed_gb_s": 1.5, "kv_transfer_latency_ms": 12.25}}
        for r in range(2)
    ],
}


def test_loads_frame_exact_and_old_names_and_bad_json(engine_http):
    info = json.dumps({"version": "0.5.15", "api_key": SECRET_ARG, "admin_api_key": None,
                       "disaggregation_transfer_backend": "nixl", "internal_states": [{}]})
    where = engine_http({"/server_info": (200, info), "/v1/loads?include=disagg": (200, json.dumps(LOADS_0515))})
    state = es.read_engine_state(f"http://{where}", engine="prefill")
    assert state.status == {"server_info": "ok", "loads": "ok"} and not state.gaps
    frame = state.loads
    assert {c: str(t) for c, t in frame.dtypes.items()} == es.LOADS_SCHEMA
    assert frame["prefill_bootstrap_queue_reqs"].tolist() == [9223372036854775807, 9223372036854775806]
    assert frame["dp_rank"].tolist() == [0, 1] and frame["mode"].tolist() == ["prefill", "prefill"]
    assert state.server_args["api_key"] == REDACTED and state.server_args["admin_api_key"] is None
    _assert_no_secret(_outputs(state))

    old = {"/get_server_info": (200, '{"version": "0.5.9"}'),
           "/get_load": (200, '[{"dp_rank": 0, "num_reqs": 1, "num_waiting_reqs": 1, "num_tokens": 5}]')}
    state = es.read_engine_state(f"http://{engine_http(old)}", engine="decode")
    assert state.endpoints == {"server_info": "/get_server_info", "loads": "/get_load"}
    assert state.loads["decode_transfer_queue_reqs"].isna().all()
    assert state.gaps[0].partial and "no disaggregation queue columns" in state.gaps[0].reason

    where = engine_http({"/server_info": (200, "<html>oops"), "/v1/loads?include=disagg": (500, "boom")})
    state = es.read_engine_state(f"http://{where}", engine="decode")
    assert state.status == {"server_info": "bad_json", "loads": "http_error"}
    assert [g.state for g in state.gaps] == ["bad_json", "http_error"]


# --------------------------------------------------------------------------------------- over SSH


@pytest.mark.server
def test_over_ssh_finds_and_reads_env(sshd, engine):
    from forensics.hosts import SSHHost

    with SSHHost("127.0.0.1", **sshd.host_args()) as host:
        scan = pc.find_processes(host, pc.ProcessSelector(title=TITLE))
        assert sorted(scan.pids()) == engine.children, scan.gaps
        child = scan.processes[0]
        s = sc.collect_settings("decode", host=host, pid=child.pid, ppid=child.ppid)
    assert s.value("decode", "env", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT") == "3600"
    _assert_no_secret(_outputs(scan, s))


USER = "pdfx-collect-test"


@pytest.fixture(scope="module")
def plain_user(sshd):
    from user_helpers import skip_reason, test_user

    if skip_reason():
        pytest.skip(skip_reason())
    with test_user(USER) as name:
        yield name


@pytest.mark.server
@pytest.mark.needs_root
def test_environ_permission_denied_is_a_gap_with_the_sudo_fix(sshd, engine, plain_user):
    from forensics.hosts import SSHHost

    with SSHHost("127.0.0.1", **{**sshd.host_args(), "user": plain_user}) as host:
        s = sc.collect_settings("prefill", host=host, pid=engine.pid)
    assert not s.engines["prefill"]["env_read"]
    (gap,) = [g for g in s.gaps if "environ" in g.reason]
    assert gap.piece == "settings" and gap.reason.startswith(f"permission denied reading /proc/{engine.pid}/environ")
    assert gap.fix.startswith("sudo = true") and gap.state == "failed"
    assert not [r for r in s.rows if r["source"] == "env"]  # nothing read stands for nothing set


# ------------------------------------------------------------------------------ property tests

CORES = ["api_key", "apikey", "token", "secret", "password", "passwd", "auth", "credential", "private_key",
         "access_key", "auth_token", "client_secret"]


@st.composite
def secret_names(draw) -> str:
    core = draw(st.sampled_from(CORES))
    sep = draw(st.sampled_from(["_", "-"]))
    core = core.replace("_", sep)
    prefix = draw(st.sampled_from(["", "HF", "OPENAI", "AWS_SECRET", "sglang", "UCX", "MOONCAKE", "admin", "x"]))
    name = f"{prefix}{sep}{core}" if prefix else core
    case = draw(st.sampled_from(["lower", "upper", "as is"]))
    return {"lower": name.lower(), "upper": name.upper(), "as is": name}[case]


secret_values = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=6,
                        max_size=24).map(lambda s: f"Qz{s}Wv")
PROPS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(secret_names(), secret_values)
def test_secret_names_are_recognised_and_hidden_everywhere(name, value):
    assert is_secret_name(name), name
    flag = "--" + name.lower().replace("_", "-").replace(".", "-")
    argv = ["python", "-m", "sglang.launch_server", flag, value, f"{flag}={value}", f"{name}={value}", "--tp", "2"]
    assert value not in json.dumps(redact_argv(argv))
    assert redact_argv(argv)[-2:] == ["--tp", "2"]
    assert value not in json.dumps(redact_env({name: value, "UCX_TLS": "rc"}))
    assert value not in json.dumps(redact_value({"a": [{name: value}], name: {"x": value}}))
    text = (f"{name}={value} {flag} {value} {flag}={value} \"{name}\": \"{value}\" Authorization: Bearer {value} "
            f"http://user:{value}@host:80/p?{name}={value}&b=1 Basic {value}")
    out = redact_text(text)
    assert value not in out, out
    assert redact_text(out) == out  # idempotent


@PROPS
@given(st.from_regex(r"[a-z]{1,8}(_[a-z]{1,8}){0,3}", fullmatch=True), secret_values)
def test_ordinary_names_keep_their_values(name, value):
    if is_secret_name(name):
        return
    assert redact_env({name: value}) == {name: value}
    assert redact_value({name: value}) == {name: value}


@PROPS
@given(secret_names(), secret_values, secret_values)
def test_no_secret_survives_any_collector_output(engine_http, name, value, url_pass):
    secrets = (value, url_pass)
    flag = "--" + name.lower().replace("_", "-")
    doc = {"btime": 1796000000, "clk_tck": 100, "self": 1, "procs": [
        {"pid": 4242, "ppid": 1, "ticks": 123456, "comm": "python3", "uid": 0,
         "cmdline": ["python3", "-m", "sglang.launch_server", flag, value, f"--x=http://u:{url_pass}@h/"]}]}
    procs, _ = pc.parse_proc_json(json.dumps(doc), "local:test")
    scan = pc.ProcessScan("local:test", pc.ProcessSelector(title="python3"), procs)
    _assert_no_secret(_outputs(scan, *procs), secrets)

    env_name = f"SGLANG_DISAGGREGATION_{name.upper().replace('-', '_').replace('.', '_')}"
    environ = (f"{env_name}={value}\0{name}={value}\0UCX_NET_DEVICES=mlx5_0:1\0"
               f"NIXL_URL=http://u:{url_pass}@h/\0").encode()
    env = sc.select_env(sc.parse_environ(environ))
    assert env[env_name] == REDACTED
    info = {"version": "0.5.15", name: value, "api_key": value, "disaggregation_transfer_backend": "nixl",
            "disaggregation_bootstrap_url": f"http://u:{url_pass}@h/", "internal_states": [{name: value}]}
    where = engine_http({"/server_info": (200, json.dumps(info))})
    state = es.read_engine_state(f"http://u:{url_pass}@{where}", engine="prefill")
    _assert_no_secret(_outputs(state), secrets)
    s = sc.collect_settings("prefill", state=state)
    s.rows += [{"engine": "prefill", "source": "env", "name": k, "value": v} for k, v in env.items()]
    s.findings = sc.assess(s)
    _assert_no_secret(_outputs(s) + s.to_json(), secrets)


def test_real_argv_lines():
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--api-key", "k1",
            "--admin-api-key=k2", "--disaggregation-mode", "prefill", "--max-total-tokens", "4096"]
    assert redact_argv(argv) == ["python3", "-m", "sglang.launch_server", "--model-path", "/models/llama",
                                 "--api-key", REDACTED, f"--admin-api-key={REDACTED}", "--disaggregation-mode",
                                 "prefill", "--max-total-tokens", "4096"]
    assert not is_secret_name("max_total_tokens") and not is_secret_name("tokenizer_path")
    assert redact_text("curl -H 'Authorization: Bearer abc.def-ghi' http://a:b@c/?token=x&n=1") == (
        f"curl -H 'Authorization: Bearer {REDACTED}' http://{REDACTED}@c/?token={REDACTED}&n=1")


@pytest.mark.parametrize(("text", "expected"), [
    ("retry(token=abc123)", f"retry(token={REDACTED})"),
    ("headers(Authorization: Bearer abc.def-ghi)", f"headers(Authorization: Bearer {REDACTED})"),
    ("(Authorization: Basic dXNlcjpwYXNz)", f"(Authorization: Basic {REDACTED})"),
    ("launch(--api-key abc123)", f"launch(--api-key {REDACTED})"),
    ("fetch(http://h/p?token=abc123)", f"fetch(http://h/p?token={REDACTED})"),
    ("cfg(password: abc123) ok", f"cfg(password: {REDACTED}) ok"),
    ("[f(password=abc(1))]", f"[f(password={REDACTED})]"),  # the value's own bracket pair is hidden with it
])
def test_a_closing_bracket_after_a_secret_is_kept(text, expected):
    # An unquoted value runs up to whitespace; the ')' that closes the text around it is not the secret's.
    assert redact_text(text) == expected
    assert "abc" not in redact_text(text) and redact_text(expected) == expected
