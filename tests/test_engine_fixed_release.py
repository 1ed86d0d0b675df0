"""Acceptance: the fixed release, real sglang 0.5.16, survives the ABORT that wedges 0.5.13-0.5.15.post1.

A PD pair of the ``slow-prefill`` model behind the mini load balancer, the decode's waiting
timeout (``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``) shorter than a 3000-token prefill: the decode
gives up on that request and sends ``[b"ABORT", room, ...]`` to the prefill's bootstrap socket
(the frame the vulnerable NIXL loop dies on; no client has to be killed at the right moment). On 0.5.16 ``bootstrap_thread`` is still alive
afterwards (py-spy, in the prefill's scheduler process) and the next request answers. Slow:
one real deployment (~5 GB) and a long prefill on 2 cores.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request

import psutil
import pytest

from forensics.engine import environment, launch, model

RELEASE = "0.5.16"
PROMPT_WORDS = 3000
WAITING_TIMEOUT_S = 60  # three 3000-token prefills in a row take longer (38.6 s the first on a quiet machine)
TIMED_OUT = re.compile(r"timed out after [0-9.]+s in KVPoll\.WaitingForInput")
READY_S = 900  # launch's 300 s default is not enough with other sessions' engines on 2 cores


def post(url: str, body: dict, timeout: float = 300) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        assert answer.status == 200
        return json.loads(answer.read())


def send_ignoring_the_answer(url: str, body: dict) -> None:
    try:
        post(url, body, timeout=900)
    except OSError:
        pass  # the decode aborts it: an error answer is the expected outcome


def scheduler_pid(server: launch.EngineProcess) -> int:
    for proc in psutil.Process(server.pid).children(recursive=True):
        try:
            if " ".join(proc.cmdline()).startswith("sglang::scheduler"):
                return proc.pid
        except psutil.Error:
            continue
    raise AssertionError(f"{server.role}: no sglang::scheduler process under pid {server.pid}")


def has_bootstrap_thread(names: list[str]) -> bool:
    return any("(bootstrap_thread)" in name or name == "bootstrap_thread" for name in names)  # "Thread-6 (bootstrap_thread)"


def thread_names(env: environment.EngineEnvironment, pid: int) -> list[str]:
    proc = subprocess.run([str(env.venv / "bin" / "py-spy"), "dump", "--json", "--pid", str(pid)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [thread.get("thread_name") or "" for thread in json.loads(proc.stdout)]


def wait_for(predicate, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - started


def log_text(process: launch.EngineProcess) -> str:
    return process.log_file.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.timeout(3600)
def test_a_waiting_timeout_abort_leaves_bootstrap_thread_alive_and_the_next_request_answers(tmp_path):
    env = environment.prepare(RELEASE)
    slow = model.build("slow-prefill", env.python)
    prefill_port, bootstrap_port, decode_port, router_port = launch.free_server_ports(4)
    prefill = launch.start_server(env, slow.path, "prefill", prefill_port, tmp_path / "prefill.log",
                                  bootstrap_port=bootstrap_port)
    decode = launch.start_server(env, slow.path, "decode", decode_port, tmp_path / "decode.log",
                                 env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S)})
    processes = [prefill, decode]
    figures = {}
    try:
        prefill.wait_ready(timeout=READY_S)
        decode.wait_ready(timeout=READY_S)
        router = launch.start_router(env, prefill.url, bootstrap_port, decode.url, router_port, tmp_path / "router.log")
        processes.append(router)
        router.wait_ready(timeout=READY_S)
        scheduler = scheduler_pid(prefill)
        assert has_bootstrap_thread(thread_names(env, scheduler))
        short = {"text": model.prompt_words(16), "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        # Three long prompts that share no prefix (so no prefix-cache hit shortens them), sent together:
        # the prefill computes them one after another, so at least the last waits past the timeout.
        words = model.prompt_words(PROMPT_WORDS).split()
        sent = time.monotonic()
        for shift in (0, 1000, 2000):
            text = " ".join(words[shift:] + words[:shift])
            threading.Thread(target=send_ignoring_the_answer, daemon=True, args=(router.url + "/generate", {
                "text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})).start()
        # The decode gives up waiting for the KV and sends ABORT for the room (the frame 0.5.15's loop dies on).
        wait_for(lambda: TIMED_OUT.search(log_text(decode)) is not None, 1200, "the decode's waiting timeout")
        figures["waiting timeout after"] = round(time.monotonic() - sent, 1)
        names = thread_names(env, scheduler)
        assert has_bootstrap_thread(names), f"bootstrap_thread is gone: {names}"
        assert "Foreign traffic" not in log_text(prefill) and "AssertionError" not in log_text(prefill)

        # Requests sent while the prefill still computes the long prompts fail by the same waiting timeout;
        # one sent after it answers (on a wedged prefill none ever would).
        started, attempts, answer = time.monotonic(), 0, None
        while answer is None and time.monotonic() - started < 1500:
            attempts += 1
            try:
                answer = post(router.url + "/generate", short, timeout=300)
            except OSError:
                time.sleep(2)
        figures["next request answered after"] = (round(time.monotonic() - started, 1), f"{attempts} attempt(s)")
        assert answer is not None and answer["meta_info"]["completion_tokens"] >= 1
        assert has_bootstrap_thread(thread_names(env, scheduler))
    finally:
        for process in reversed(processes):
            process.stop()
    for process in processes:
        assert not process.alive(), f"{process.role} left processes behind"
    print(f"\n0.5.16 abort: {figures}")
