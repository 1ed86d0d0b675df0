"""``forensics logs`` in an 80x40 terminal: repeated events are one line each, every event on demand.

Run in a real pseudo-terminal (the way an on-call engineer sees it), escape codes and carriage
returns stripped before lines are counted. The input is the generated 0.5.15 incident: one abort,
the thread's death, then 418 waiting timeouts, which once printed one row each.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from forensics.logs import incident

TOKEN = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07]*\x07|\r\n|[\r\n]|[^\x1b\r\n]+")


def screen_lines(text: str) -> list[str]:
    """What a terminal shows after ``text``: lines, with carriage returns, erase-line and cursor-up
    applied (rich's transient progress bar erases itself that way) and every other escape dropped."""
    lines, current = [], ""
    for found in TOKEN.finditer(text):
        token, argument, command = found.group(0), found.group(1), found.group(2)
        if command == "A":  # cursor up: the line above becomes the current one
            for _ in range(int(argument or 1)):
                current = lines.pop() if lines else ""
        elif command == "K":
            current = ""  # erase the line (rich erases whole lines)
        elif command:
            continue
        elif token.startswith("\x1b"):
            continue
        elif token in ("\n", "\r\n"):
            lines.append(current)
            current = ""
        elif token == "\r":
            current = ""  # what follows overwrites the line
        else:
            current += token
    return lines + ([current] if current else [])


@pytest.fixture(scope="module")
def storm_logs(tmp_path_factory) -> Path:
    story = incident.generate("0.5.15", steady_seconds=60, after_seconds=330, waiting_timeout=120)
    folder = tmp_path_factory.mktemp("storm-logs")
    incident.write_sglang_logs(story, folder)
    assert len(story.timeout_rooms) > 300
    return folder


def in_terminal(*args: str, columns: int = 80, rows: int = 40) -> tuple[int, list[str]]:
    """Run ``forensics ARGS`` in a pseudo-terminal of ``columns`` x ``rows``: (exit, non-blank lines)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.Popen([sys.executable, "-m", "forensics", *args], stdin=follower, stdout=follower,
                            stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            done.kill()
            raise AssertionError("forensics logs printed nothing for 120 s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    status = done.wait(timeout=60)
    lines = screen_lines(b"".join(chunks).decode("utf-8", "replace"))
    return status, [line for line in lines if line.strip()]


def test_repeated_events_are_one_line_and_every_line_fits(storm_logs):
    status, lines = in_terminal("logs", str(storm_logs / "prefill.log"), str(storm_logs / "decode.log"))
    assert status == 1
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    events = [line for line in lines if re.match(r"\d\d:\d\d:\d\d (decode|prefill) ", line)]
    timeouts = [line for line in events if "decode_transfer_timeout" in line]
    assert len(timeouts) == 1 and "x418 to " in timeouts[0], timeouts
    assert len(events) <= 6, events
    # 250 lines before; the summary and the findings table are most of it. Where the files live
    # does not change the count: the table, the summary and the sources name them by file name.
    assert len(lines) <= 45, "\n".join(lines)
    assert not any(str(storm_logs) in line for line in lines), [line for line in lines if str(storm_logs) in line]
    death = next(line for line in lines if line.startswith("│ critical │ thread_death"))
    assert death.split("│")[3].strip() == "1"  # one death, though its traceback also names the GUARD assertion
    assert lines[0].startswith("Verdict: FINDINGS")


def test_each_shows_one_line_per_event(storm_logs):
    status, lines = in_terminal("logs", str(storm_logs / "decode.log"), "--each")
    assert status == 1
    timeouts = [line for line in lines if re.match(r"\d\d:\d\d:\d\d decode +decode_transfer_timeout", line)]
    assert len(timeouts) >= 190  # the first 200 rows (the abort and the hints among them), then how many more
    assert any("more events (use --json or --csv for all)" in line for line in lines)
