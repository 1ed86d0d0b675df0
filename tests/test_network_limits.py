"""Every network read has a total deadline and a byte cap; a silent SSH host is one clear line (issue 19).

Real servers on 127.0.0.1 started here: an HTTP server whose /metrics (or /server_info, or
Prometheus API) answers one byte every 0.5 s, or sends a page over the byte cap; a TCP
socket that accepts and never speaks, as an SSH target. ``forensics collect``, ``diagnose
--inventory`` and ``watch --json`` run in child processes against inventories of local
engines pointed at them: each ends within a bound set by the deadlines, keeps and writes
the rest, names the gap with its URL and limit, and exits by the contract.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import one_document
from http_helpers import Oversized, RoutesServer, Trickle
from sshd_helpers import free_port

from forensics.collectors import engine_state as es
from forensics.collectors.prometheus_api import PrometheusAPI, PrometheusQueryError

MiB = 1024 * 1024
RUN_TIMEOUT_S = 240  # a child that never ends fails the test here, never hangs it

# Trickling and oversized HTTP servers and a mute TCP listener, started here: not the fast lane.
pytestmark = pytest.mark.server


def _inventory(tmp_path: Path, url: str, *, host: str = "local", hosts_table: str = "") -> Path:
    """A prefill and a decode on ``host`` whose URL is ``url`` (no twin, no processes, no logs)."""
    path = tmp_path / "inventory.toml"
    path.write_text(f'''[deployment]
name = "netcap"
sglang = "0.5.15"
backend = "nixl"
{hosts_table}
[[engine]]
role = "prefill"
host = "{host}"
url = "{url}"
bootstrap_port = {free_port()}

[[engine]]
role = "decode"
host = "{host}"
url = "{url}"
''')
    return path


def _own_peak_kib(pid: int) -> int | None:
    """The child's own peak RSS (``VmHWM``) once it runs the command, or None before its exec.

    Not its rusage: a forked child's high-water mark starts at the parent's RSS and survives the
    exec, so a pytest worker grown to 550 MB made every child's ``ru_maxrss`` read 550 MB. The mm
    an exec creates starts its own ``VmHWM``, which only grows: the last reading is the peak.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"forensics" not in handle.read():
                return None
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _run(*args: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """``python -m forensics ARGS`` in a child: (result, seconds, the child's own peak RSS in KiB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "forensics", *args], stdout=out, stderr=err,
                                env={**os.environ, "COLUMNS": "200"})
        peak = 0
        while proc.poll() is None:
            if time.monotonic() - began > RUN_TIMEOUT_S:
                proc.kill()
                proc.wait(30)
                pytest.fail(f"forensics {' '.join(args)} did not end within {RUN_TIMEOUT_S} s")
            peak = max(peak, _own_peak_kib(proc.pid) or 0)  # a zombie's status has no VmHWM: read while it runs
            time.sleep(0.02)
        elapsed = time.monotonic() - began
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out.read().decode(), err.read().decode())
    return result, elapsed, peak


def _gap(document: dict, piece: str, needle: str) -> list[dict]:
    return [g for g in document["gaps"] if g["piece"] == piece and needle in g["reason"]]


# ------------------------------------------------------------------------- a trickling /metrics


HEALTH = {"/health": (200, ""), "/health_generate": (200, "")}  # the engine's health answers: only /metrics is sick


@pytest.fixture
def trickling():
    with RoutesServer({"/metrics": (200, Trickle(every_s=0.5)), **HEALTH}) as server:
        yield server


def test_collect_with_a_trickling_metrics_page_writes_the_bundle_and_names_the_gap(trickling, tmp_path):
    inventory = _inventory(tmp_path, trickling.url)
    result, elapsed, _ = _run("collect", "--inventory", str(inventory), "--out", str(tmp_path / "bundle"),
                              "--sample", "2s", "--json")
    document = one_document(result.stdout)
    assert result.returncode == 3 and document["status"] == "partial" and document["exit"] == 3, result.stderr
    # 2 s of sampling, then the scrape in flight ends by its 5 s total deadline (the old code: 36 s, exit 5)
    assert elapsed < 30, elapsed
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["status"] == "partial" and manifest["exit"] == 3
    url = f"{trickling.url}/metrics"
    for engine in ("prefill-0", "decode-0"):
        (gap,) = [g for g in _gap(document, "metrics", url) if g["target"] == engine]
        assert "timed out: no complete answer within the 5 s total deadline" in gap["reason"], gap
        assert "too slowly" in gap["fix"]
    assert document["pieces"]["scrapes"] >= 2 and document["pieces"]["probes"] > 0  # the rest is kept
    assert manifest["gaps"] == document["gaps"]
    assert "Traceback" not in result.stderr


def test_diagnose_inventory_with_a_trickling_metrics_page_is_inconclusive_naming_it(trickling, tmp_path):
    inventory = _inventory(tmp_path, trickling.url)
    result, elapsed, _ = _run("diagnose", "--inventory", str(inventory), "--sample", "2s", "--json")
    document = one_document(result.stdout)
    assert result.returncode == 3 and document["exit"] == 3 and document["verdict"] == "INCONCLUSIVE", result.stderr
    assert elapsed < 30, elapsed
    assert len(_gap(document, "metrics", "5 s total deadline")) == 2
    assert any(f"{trickling.url}/metrics failed (timed out" in reason for reason in document["reasons"])


def test_watch_json_lines_end_with_a_final_line_carrying_the_real_exit(trickling, tmp_path):
    inventory = _inventory(tmp_path, trickling.url)
    result, elapsed, _ = _run("watch", "--inventory", str(inventory), "--for", "3s", "--json")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and all(list(doc)[:2] == ["status", "exit"] for doc in lines), result.stdout
    final = lines[-1]
    assert final["final"] is True and final["change"] is False and final["changes"] == len(lines) - 1
    assert all(doc["change"] for doc in lines[:-1]) and "final" not in lines[0]
    assert final["exit"] == result.returncode == 3 and final["verdict"] == "INCONCLUSIVE", result.stderr
    assert elapsed < 30, elapsed


# ------------------------------------------------------------------ a /metrics page over the cap


@pytest.mark.parametrize("content_length", [True, False], ids=["declared", "close-delimited"])
def test_a_107_mib_metrics_page_is_a_gap_and_memory_stays_bounded(tmp_path, content_length):
    page = Oversized(107 * MiB, content_length=content_length)
    with RoutesServer({"/metrics": (200, page), **HEALTH}) as server:
        inventory = _inventory(tmp_path, server.url)
        result, elapsed, peak_kib = _run("collect", "--inventory", str(inventory), "--out", str(tmp_path / "b"),
                                         "--sample", "2s", "--json")
    document = one_document(result.stdout)
    assert peak_kib < 400 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"  # the old code: 0.6 to 3.8 GB
    assert result.returncode == 3 and document["exit"] == 3, result.stderr
    gaps = _gap(document, "metrics", f"{server.url}/metrics")
    assert len(gaps) == 2 and all("over the 32 MiB cap" in g["reason"] or "longer than the 32 MiB cap" in g["reason"]
                                  for g in gaps), gaps
    assert (tmp_path / "b" / "manifest.json").is_file()
    assert elapsed < 60, elapsed


def test_the_byte_cap_reads_incrementally_and_the_deadline_is_wall_clock():
    from forensics.collectors import bounded_http

    with RoutesServer({"/big": (200, Oversized(8 * MiB, content_length=False)),
                       "/slow": (200, Trickle(every_s=0.2))}) as server:
        with pytest.raises(bounded_http.AnswerTooLarge, match=r"longer than the 1 MiB cap \(stopped reading at "):
            bounded_http.get(server.url + "/big", limits=bounded_http.ReadLimits(30, 1 * MiB))
        began = time.monotonic()
        with pytest.raises(bounded_http.AnswerTooSlow, match=r"/slow: timed out: .* 1.5 s total deadline") as caught:
            bounded_http.get(server.url + "/slow", limits=bounded_http.ReadLimits(1.5, 1 * MiB))
        assert 1.4 < time.monotonic() - began < 3.0 and caught.value.received > 0
        ok = bounded_http.get(server.url + "/missing", limits=bounded_http.JSON_LIMITS)
        assert ok.status == 404 and ok.body == b'{"detail":"Not Found"}'


def test_a_sample_line_of_10_mb_is_a_problem_naming_the_line_and_the_limit():
    from forensics.collectors.metrics import ExpositionParseError, parse_exposition

    page = b'# TYPE m gauge\nm{a="' + b"x" * (10 * MiB) + b'"} 1\nm 2\n'  # the old code kept it in every scrape: 1.9 GB
    parsed = parse_exposition(page)
    assert parsed.metric == ["m"] and parsed.value_text == ["2"]  # the line after it is kept
    assert parsed.problems_total == 1 and parsed.problems[0].lineno == 2
    assert len(parsed.problems[0].line) <= 10 * MiB + 16 and "over the 65536" in parsed.problems_text()
    with pytest.raises(ExpositionParseError, match=r"line 2: a sample line of 10485769 characters, over the 65536"):
        parse_exposition(page, strict=True)
    assert len(parse_exposition(b'm{a="' + b"x" * 60000 + b'"} 1\n')) == 1  # long, but under the limit


# ------------------------------------------------------------- JSON endpoints and Prometheus API


def _bounded_call(function, within_s: float):
    """``function()`` in a thread; fails (instead of hanging) when it is not back within ``within_s``."""
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(value=function()), daemon=True)
    began = time.monotonic()
    thread.start()
    thread.join(within_s)
    assert not thread.is_alive(), f"still reading after {within_s} s"
    return got["value"], time.monotonic() - began


def test_server_info_trickling_or_oversized_is_a_gap_naming_the_limit():
    with RoutesServer({"/server_info": (200, Trickle(every_s=0.5))}) as server:
        state, elapsed = _bounded_call(lambda: es.read_engine_state(server.url, engine="decode", timeout=2), 20)
    assert elapsed < 5 and state.status == {"server_info": "timed_out", "loads": "timed_out"}
    assert f"{server.url}/server_info: timed out" in state.gaps[0].reason and "2 s total deadline" in state.gaps[0].reason
    routes = {"/server_info": (200, Oversized(3 * MiB)), "/v1/loads?include=disagg": (200, Oversized(3 * MiB, False))}
    with RoutesServer(routes) as server:
        state = es.read_engine_state(server.url, engine="decode", max_bytes=1 * MiB)
    assert state.status == {"server_info": "too_large", "loads": "too_large"}
    assert "over the 1 MiB cap" in state.gaps[0].reason and "longer than the 1 MiB cap" in state.gaps[1].reason


def test_prometheus_api_trickling_is_an_environment_problem_within_its_deadline():
    with RoutesServer({"/api/v1/query?query=up": (200, Trickle(every_s=0.5))}) as server:
        api = PrometheusAPI(server.url, timeout_s=2)
        caught, elapsed = _bounded_call(lambda: pytest.raises(PrometheusQueryError, api.instant, "up"), 20)
    assert elapsed < 5 and "/api/v1/query: timed out" in str(caught.value) and "2 s total deadline" in str(caught.value)


# ------------------------------------------------------------------ an SSH host that never speaks


@pytest.fixture
def silent_host():
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, name="silent-host", daemon=True)
    thread.start()
    yield listener.getsockname()[1], held
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def test_a_host_that_accepts_and_never_speaks_is_one_clear_reason_and_no_traceback(silent_host, tmp_path):
    port, held = silent_host
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    hosts = (f'\n[hosts.mute]\naddress = "127.0.0.1"\nport = {port}\nuser = "nobody"\nconnect_timeout = 2\n'
             f'known_hosts = "{known_hosts}"\nssh_config = "/dev/null"\n')
    inventory = tmp_path / "mute.toml"
    with RoutesServer({}) as server:
        text = _inventory(tmp_path, server.url, host="mute", hosts_table=hosts).read_text()
        text = text.replace('url = "', 'process = { title = "sglang::scheduler" }\nlogs = { file = "/var/log/x.log" }\n'
                                      'url = "')
        inventory.write_text(text)
        result, elapsed, _ = _run("collect", "--inventory", str(inventory), "--out", str(tmp_path / "b"),
                                  "--sample", "1s", "--json")
    document = one_document(result.stdout)
    assert "Traceback" not in result.stderr and "paramiko" not in result.stderr, result.stderr
    assert result.stderr.strip() == "", result.stderr
    assert result.returncode == 3 and document["status"] == "partial", result.stderr  # the HTTP pieces were read
    banner = [g for g in document["gaps"] if g["state"] == "disconnected"]
    assert banner and all(f"[127.0.0.1]:{port}" in g["reason"] for g in banner), document["gaps"]
    assert all("accepted the connection but sent no SSH banner within 2 s" in g["reason"] for g in banner), banner
    # One wait for the host, not one per piece: every later piece is told at once.
    assert len(held) == 1, f"{len(held)} connections to the silent host"
    assert elapsed < 30, elapsed


@pytest.fixture
def stuck_sshd(tmp_path):
    """A real SSH server (paramiko's, on 127.0.0.1) that authenticates any key, opens sessions and never
    answers an exec request: what a stuck sshd looks like from the client."""
    import paramiko

    host_key = paramiko.RSAKey.generate(2048)
    client_key = paramiko.RSAKey.generate(2048)
    client_key.write_private_key_file(str(tmp_path / "id_rsa"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    release = threading.Event()
    transports: list = []

    class Stuck(paramiko.ServerInterface):
        def get_allowed_auths(self, username):
            return "publickey"

        def check_auth_publickey(self, username, key):
            return paramiko.AUTH_SUCCESSFUL

        def check_channel_request(self, kind, chanid):
            return paramiko.OPEN_SUCCEEDED

        def check_channel_exec_request(self, channel, command):
            release.wait(60)  # never answers while the test runs
            return False

    def serve() -> None:
        listener.settimeout(0.2)
        while not release.is_set():
            try:
                conn = listener.accept()[0]
            except TimeoutError:
                continue
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transport.start_server(server=Stuck())
            transports.append(transport)

    thread = threading.Thread(target=serve, name="stuck-sshd", daemon=True)
    thread.start()
    yield port, tmp_path
    release.set()
    thread.join(5)
    for transport in transports:
        transport.close()
    listener.close()


def test_a_command_the_sshd_never_starts_ends_by_the_connect_timeout(stuck_sshd):
    from forensics.hosts import SSHHost, State

    port, folder = stuck_sshd
    host = SSHHost("127.0.0.1", port=port, user="ops", key_filename=str(folder / "id_rsa"),
                   known_hosts=str(folder / "known_hosts"), ssh_config="/dev/null", allow_agent=False,
                   connect_timeout=2, name="stuck")
    try:
        result, elapsed = _bounded_call(lambda: host.run(["true"], timeout=5), 30)
    finally:
        host.close()
    assert result.state is State.DISCONNECTED and elapsed < 10, (result, elapsed)
    assert result.error == "stuck opened the session but did not start the command within 2 s (its sshd is stuck)"
