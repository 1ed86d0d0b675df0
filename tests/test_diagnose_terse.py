"""``forensics diagnose`` in an 80x40 terminal: the verdict first, each fact once, at most 24 lines.

Run in a real pseudo-terminal (``test_logs_terse.in_terminal``). Before, the wedged bundle below
printed 44 lines at 80 columns: the reasons, the signals and the kill chain said the same three
sentences, and the verdict scrolled off a 40-row screen once the progress had run.
"""

from __future__ import annotations

import subprocess
import sys

import tomli_w
from sshd_helpers import free_port
from test_cli_live import _wedged_bundle
from test_logs_terse import in_terminal

from forensics.diagnosis.terse import MAX_LINES


def diagnose_in_terminal(*args: str) -> tuple[int, list[str]]:
    """``forensics diagnose ARGS`` at 80x40, without the notices any command prints first about
    probe keepers of earlier commands (another command's, on a machine shared with other runs)."""
    status, lines = in_terminal("diagnose", *args)
    kept, in_notice = [], False
    for line in lines:
        if line.startswith("forensics: keeper pid "):
            in_notice = True
        elif in_notice and line.startswith("  "):
            continue
        else:
            in_notice = False
            kept.append(line)
    return status, [line for line in kept if not line.startswith("forensics: keeper pid ")]


def test_a_wedge_fits_24_lines_with_the_verdict_first_and_each_fact_once(tmp_path):
    folder = _wedged_bundle(tmp_path / "incident 03h00 (pd-prod-7)")
    status, lines = diagnose_in_terminal("--bundle", str(folder))
    assert status == 1
    assert lines[0].startswith("WEDGED  pd-prod-7  (exit 1)"), lines
    assert len(lines) <= MAX_LINES, "\n".join(lines)
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    text = "\n".join(lines)
    assert text.count("missing on prefill pid 4242") == 1, text  # once: in the kill chain
    sources = {line.split()[0]: line for line in lines[lines.index("Sources") + 1:lines.index("Kill chain")]}
    assert sources["threads"].split(None, 1)[1] == "wedge: bootstrap_thread_missing (prefill-0)"
    assert sources["logs"].split(None, 1)[1] == "not read: journalctl not found"
    assert sources["metrics"].split(None, 1)[1] == "not collected"  # never "nothing found" for what was not read
    assert "Next" in lines and any(line.startswith("  1. recover now: restart prefill-0") for line in lines)


def test_verbose_keeps_every_reason_signal_and_gap(tmp_path):
    folder = _wedged_bundle(tmp_path / "incident")
    status, lines = diagnose_in_terminal("--bundle", str(folder), "--verbose")
    assert status == 1
    text = "\n".join(lines)
    for heading in ("Kill chain", "Signals", "Not collected", "Next"):
        assert heading in text, heading
    assert "install systemd" in text  # the gap's fix, which the terse line leaves out


def _unreachable_inventory(tmp_path) -> str:
    """A prefill, a decode and a router on loopback ports nothing listens on."""
    engines = [{"role": role, "name": f"{role}-0", "host": "local", "url": f"http://127.0.0.1:{free_port()}"}
               for role in ("prefill", "decode", "router")]
    engines[0]["bootstrap_port"] = free_port()
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(tomli_w.dumps({"deployment": {"name": "nowhere", "sglang": "0.5.15", "backend": "nixl"},
                                        "engine": engines}))
    return str(inventory)


def test_an_unreachable_deployment_is_short_and_says_what_was_not_reached(tmp_path):
    inventory = _unreachable_inventory(tmp_path)
    status, lines = diagnose_in_terminal("--inventory", inventory, "--sample", "2s")
    assert len(lines) <= MAX_LINES, "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    assert status == 1 and lines[0] == "DOWN  nowhere  (exit 1)", lines
    chain = lines[lines.index("Kill chain") + 1:lines.index("Next")]
    assert len(chain) == 6 and all("refused: nothing listens at" in step for step in chain), chain
    assert not any("refused" in line for line in lines[1:lines.index("Sources")])  # not said twice


def test_watch_in_a_terminal_wraps_between_words_and_names_the_first_verdict(tmp_path):
    inventory = _unreachable_inventory(tmp_path)
    status, lines = in_terminal("watch", "--inventory", inventory, "--for", "3s", columns=60)
    assert status == 1, lines
    first = next(i for i, line in enumerate(lines) if " -> DOWN: " in line)
    assert lines[first][8:].startswith(" start -> DOWN: "), lines[first]
    change = [lines[first]] + [line for line in lines[first + 1:first + 4] if line.startswith(" " * 9)]
    assert all(len(line) <= 60 for line in change), change
    # Joined back, the terminal's lines are the log line's words: no word was cut in two.
    piped = subprocess.run([sys.executable, "-m", "forensics", "watch", "--inventory", inventory, "--for", "3s"],
                           capture_output=True, text=True, timeout=120)
    logged = next(line for line in piped.stdout.splitlines() if " start -> DOWN: " in line)
    assert " ".join(line.strip() for line in change)[9:] == logged.split(" ", 1)[1], (change, logged)
