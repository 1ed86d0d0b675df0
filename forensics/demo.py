"""The incident demo: one killed client wedges a vulnerable twin; the patched twin survives.

Everything here is library calls a notebook could make: the twin (``forensics.twin``)
runs sglang's own bootstrap loop, a client is killed while its KV transfer is pending,
and the log forensics (``forensics.logs``) reads the twin's own log files to prove
what happened. The demo only watches: each step records what it saw, and the story
holds when the vulnerable twin wedged and the patched one did not.
"""

from __future__ import annotations

import html
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

Progress = Callable[[str], None]


@dataclass
class Step:
    twin: str  # "vulnerable" | "patched"
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class DemoResult:
    release: str
    steps: list[Step] = field(default_factory=list)
    summary_sentences: list[str] = field(default_factory=list)
    directories: dict[str, str] = field(default_factory=dict)  # kept twin directories (with --dir only)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(step.ok for step in self.steps)

    def to_dict(self) -> dict:
        return {"release": self.release, "ok": self.ok, "seconds": round(self.seconds, 2),
                "steps": [step.__dict__ for step in self.steps], "log_summary": self.summary_sentences,
                "directories": self.directories}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([step.__dict__ for step in self.steps])

    def __rich__(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"Incident demo on the twin, sglang {self.release} (NIXL)")
        for column in ("twin", "step", "result", "what we saw", "s"):
            table.add_column(column, overflow="fold")
        for step in self.steps:
            table.add_row(step.twin, step.name, Text("ok" if step.ok else "UNEXPECTED",
                                                     style="green" if step.ok else "bold red"),
                          Text(step.detail), f"{step.seconds:.1f}")
        verdict = ("The story held: the vulnerable twin wedged on one killed client while /health stayed 200, "
                   "and the patched twin survived the same kill." if self.ok else
                   "The story did NOT hold; see the unexpected steps above.")
        parts = [table]
        if self.summary_sentences:
            parts.append(Panel(Text("\n".join(f"• {s}" for s in self.summary_sentences)),
                               title="What the vulnerable twin's logs say (forensics logs)", expand=False))
        parts.append(Text(f"{verdict} ({self.seconds:.0f} s)", style="bold green" if self.ok else "bold red"))
        return Group(*parts)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{s.twin}</td><td>{html.escape(s.name)}</td><td>{'ok' if s.ok else '<b>UNEXPECTED</b>'}</td>"
            f"<td>{html.escape(s.detail)}</td><td>{s.seconds:.1f}</td></tr>" for s in self.steps)
        return (f"<table><caption>Incident demo, sglang {self.release}</caption><tr><th>twin</th><th>step</th>"
                f"<th>result</th><th>what we saw</th><th>s</th></tr>{rows}</table>")


# ------------------------------------------------------------------------- client helpers


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _twin_state(base_url: str) -> dict:
    status, body = _get(base_url + "/server_info", timeout=5.0)
    return json.loads(body)["internal_states"][0]["twin"]


def _wait_until(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return None


def _generate(router: str, timeout: float, prompt_tokens: int = 64) -> tuple[bool, str]:
    """One non-streaming request through the router: (completed, what happened)."""
    body = json.dumps({"input_ids": list(range(prompt_tokens)), "sampling_params": {"max_new_tokens": 8}}).encode()
    request = urllib.request.Request(router + "/generate", data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status == 200, f"completed with {response.status} in {time.monotonic() - started:.2f} s"
    except TimeoutError:
        return False, f"no answer within {timeout:.0f} s (hung)"
    except urllib.error.HTTPError as exc:
        return False, f"failed with HTTP {exc.code}"
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            return False, f"no answer within {timeout:.0f} s (hung)"
        return False, f"failed: {exc.reason}"


def kill_client_during_transfer_wait(deployment, prompt_tokens: int = 20000, timeout: float = 30.0) -> str:
    """Open a streaming request, wait until the decode waits for its KV, then drop the client.

    A long prompt (20,000 tokens: about 4 s of prefill at the twin's default rate) keeps the
    transfer pending long enough to catch it even on a loaded machine.
    """
    decode_before = _twin_state(deployment.decode)["counters"]["transfer_failed"]
    url = urlparse(deployment.router)
    body = json.dumps({"input_ids": list(range(prompt_tokens)), "sampling_params": {"max_new_tokens": 50},
                       "stream": True}).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    try:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: twin\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if not _wait_until(lambda: _twin_state(deployment.decode)["transfer_queue"] >= 1, timeout):
            return "the request never reached the decode transfer queue"
    finally:
        sock.close()  # the client is gone; the router closes its upstream requests
    failed = _wait_until(
        lambda: _twin_state(deployment.decode)["counters"]["transfer_failed"] > decode_before, timeout)
    return "client killed while its KV was pending; the decode aborted the transfer" if failed else \
        "client killed, but the decode never aborted the transfer"


# ------------------------------------------------------------------------------ the story


def run(release: str = "0.5.15", *, directory: str | Path | None = None, progress: Progress | None = None,
        hang_timeout: float = 5.0) -> DemoResult:
    """Vulnerable twin: kill one client, prove the wedge; patched twin: same kill, prove it held."""
    from forensics import twin
    from forensics.logs import scan

    say = progress or (lambda message: None)
    result = DemoResult(release=release)
    started = time.monotonic()
    base = Path(directory) if directory else None

    def step(twin_name: str, name: str, ok: bool, detail: str, since: float) -> None:
        result.steps.append(Step(twin_name, name, ok, detail, time.monotonic() - since))
        say(f"[{twin_name}] {name}: {detail}")

    for twin_name, patched in (("vulnerable", False), ("patched", True)):
        t0 = time.monotonic()
        say(f"starting the {twin_name} twin (sglang {release}{', patched' if patched else ''})")
        with twin.up(release, patched=patched, directory=(base / twin_name) if base else None) as deployment:
            if base is not None:  # a twin directory of our own making is removed when the twin goes down
                result.directories[twin_name] = str(deployment.directory)
            step(twin_name, "twin up", True, f"router {deployment.router}, ready in {deployment.timings['total']:.1f} s", t0)
            t0 = time.monotonic()
            completed, detail = _generate(deployment.router, timeout=30.0)
            step(twin_name, "a request before the kill", completed, detail, t0)
            t0 = time.monotonic()
            detail = kill_client_during_transfer_wait(deployment)
            step(twin_name, "kill one streaming client", "decode aborted" in detail, detail, t0)
            t0 = time.monotonic()
            if patched:
                alive = _wait_until(lambda: _twin_state(deployment.prefill)["bootstrap_thread_alive"], 5.0)
                step(twin_name, "prefill bootstrap thread", bool(alive),
                     "alive after the ABORT" if alive else "DEAD after the ABORT", t0)
            else:
                dead = _wait_until(lambda: _twin_state(deployment.prefill)["bootstrap_thread_alive"] is False, 20.0)
                step(twin_name, "prefill bootstrap thread", bool(dead),
                     "died (sglang's own bootstrap_thread)" if dead else "still alive (expected it to die)", t0)
            t0 = time.monotonic()
            codes = {role: _get(getattr(deployment, role) + "/health", timeout=30.0)[0]
                     for role in ("prefill", "decode", "router")}
            step(twin_name, "/health", all(code == 200 for code in codes.values()),
                 ", ".join(f"{role} {code}" for role, code in codes.items()), t0)
            t0 = time.monotonic()
            completed, detail = _generate(deployment.router, timeout=hang_timeout if not patched else 30.0)
            step(twin_name, "a new request after the kill", completed == patched, detail, t0)
            t0 = time.monotonic()
            logs = scan(sorted(deployment.directory.glob("*.log")))
            deaths = logs.events[logs.events["signature"] == "thread_death"]
            if patched:
                handled = (logs.events["signature"] == "abort_received").sum()
                # The fix held only if the ABORT reached the loop and was handled, not merely if nothing died.
                step(twin_name, "forensics logs", len(deaths) == 0 and handled > 0,
                     f"no thread death; {handled} ABORT handled at INFO by the patched loop", t0)
            else:
                found = len(deaths) > 0 and "Foreign traffic?" in str(deaths.iloc[0]["message"])
                where = f"{Path(deaths.iloc[0]['source']).name}:{deaths.iloc[0]['line']}" if len(deaths) else "-"
                step(twin_name, "forensics logs", found,
                     f"thread death found: {deaths.iloc[0]['thread']} {deaths.iloc[0]['message']} [{where}]"
                     if found else "no thread death in the logs", t0)
                result.summary_sentences = logs.summary().sentences
    result.seconds = time.monotonic() - started
    return result
