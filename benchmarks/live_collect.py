"""Live collection costs: a py-spy dump of the twin's prefill, and collecting from 50 SSH targets.

    python -m benchmarks live_collect [--dumps 30] [--targets 50] [--no-write]

Thread dump: ``forensics.threads.dump_threads`` (``py-spy dump --json`` plus parsing into
the threads frame) of a 0.5.15 twin's prefill, ``--dumps`` times; the median and p90.

Fan-out: ``fx.collect`` (processes, /server_info and /v1/loads, settings, logs over SFTP)
from an inventory whose engines sit on ``--targets`` SSH hosts, each its own connection
to one test sshd (``MaxStartups 100``) on 127.0.0.1, against the same collection from one
host. Half the engines are prefills and half decodes, all pointing at the one twin. The
thread dump is left out of the fan-out: py-spy attaches with ptrace, and 25 dumps of one
pid at once would race for it (a real deployment has one process per engine).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import tomli_w

from benchmarks._results import benchmark_parser, publish

BENCHMARK = "py-spy dump + parse of the twin's prefill (median); collect from 50 SSH targets vs 1"
SECTION_START = "<!-- live-collect:start -->"
SECTION_END = "<!-- live-collect:end -->"
FANOUT_PIECES = ("processes", "server_info", "settings", "logs")


def _dumps(twin, count: int) -> list[float]:
    from forensics.hosts import LocalHost
    from forensics.threads import dump_threads

    py_spy = str(Path(sys.executable).with_name("py-spy"))
    host, pid, times = LocalHost(), twin.scheduler_pid("prefill"), []
    for _ in range(count):
        started = time.perf_counter()
        dump = dump_threads(host, pid, py_spy=py_spy)
        times.append(time.perf_counter() - started)
        if not dump.ok or not len(dump.frame):
            raise RuntimeError(f"dump failed: {dump.summary()}")
    return times


def _inventory(twin, sshd, targets: int, path: Path) -> Path:
    source = twin.inventory
    hosts, engines = {}, []
    for index in range(targets):
        name = f"node-{index}"
        hosts[name] = {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "key": str(sshd.client_key),
                       "known_hosts": str(sshd.known_hosts), "ssh_config": "/dev/null"}
        role = "prefill" if index % 2 == 0 else "decode"
        engine = source.engine(role)
        entry = {"name": f"{role}-{index}", "role": role, "host": name, "url": engine.url,
                 "logs": {"file": engine.log_file}, "process": {"title": engine.process, "pid_file": engine.pid_file}}
        if engine.bootstrap_port is not None:
            entry["bootstrap_port"] = engine.bootstrap_port
        engines.append(entry)
    if targets == 1:  # one host: its prefill and its decode
        engine = source.engine("decode")
        engines.append({"name": "decode-0", "role": "decode", "host": "node-0", "url": engine.url,
                        "logs": {"file": engine.log_file},
                        "process": {"title": engine.process, "pid_file": engine.pid_file}})
    document = {"deployment": {"name": f"fanout-{targets}", "sglang": source.sglang, "backend": "nixl"},
                "hosts": hosts, "engine": engines}
    path.write_text(tomli_w.dumps(document))
    return path


def _collect(inventory: Path) -> tuple[float, object]:
    import forensics as fx

    started = time.perf_counter()
    evidence = fx.collect(inventory, pieces=FANOUT_PIECES, sample_s=0.0, workers=64)
    return time.perf_counter() - started, evidence


def measure(dumps: int, targets: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from sshd_helpers import start_sshd

    import forensics.twin as twin_api

    with tempfile.TemporaryDirectory() as directory:
        twin = twin_api.up("0.5.15", directory=Path(directory) / "twin")
        sshd = start_sshd()
        try:
            dump_times = _dumps(twin, dumps)
            one_s, one = _collect(_inventory(twin, sshd, 1, Path(directory) / "one.toml"))
            many_s, many = _collect(_inventory(twin, sshd, targets, Path(directory) / "many.toml"))
        finally:
            sshd.stop()
            twin.down()
    return {"dumps": dump_times, "one_s": one_s, "one_gaps": [str(g) for g in one.gaps], "many_s": many_s,
            "many_gaps": [str(g) for g in many.gaps], "targets": targets,
            "many_engines": len(many.frames["engines"]),
            "many_processes": int((many.frames["processes"]["state"] == "running").sum())}


def section(result: dict) -> str:
    dumps = sorted(result["dumps"])
    p90 = statistics.quantiles(dumps, n=10)[-1]
    load = os.getloadavg()
    ratio = result["many_s"] / result["one_s"]
    lines = [
        SECTION_START,
        "## Live collection: thread dumps and fan-out",
        "",
        f"`python -m benchmarks live_collect` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; 2 CPUs).",
        "",
        f"- `dump_threads` (py-spy dump --json + parse) of a 0.5.15 twin's prefill, {len(dumps)} dumps: "
        f"median **{1000 * statistics.median(dumps):.0f} ms**, p90 {1000 * p90:.0f} ms, "
        f"min {1000 * dumps[0]:.0f} ms, max {1000 * dumps[-1]:.0f} ms.",
        f"- `fx.collect` ({', '.join(FANOUT_PIECES)}) over SSH: one target (a prefill and a decode on one host) "
        f"**{result['one_s']:.2f} s**; {result['targets']} targets (one SSH connection each to one sshd, "
        f"{result['many_engines']} engines, {result['many_processes']} processes found) "
        f"**{result['many_s']:.2f} s** = {ratio:.1f}x the single target's time for {result['targets']}x the hosts.",
        f"- gaps: one target {len(result['one_gaps'])}, {result['targets']} targets {len(result['many_gaps'])}"
        + (f" (first: {result['many_gaps'][0]})" if result["many_gaps"] else ""),
        SECTION_END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("live_collect", BENCHMARK)
    parser.add_argument("--dumps", type=int, default=30)
    parser.add_argument("--targets", type=int, default=50)
    args = parser.parse_args(argv)
    result = measure(args.dumps, args.targets)
    text = section(result)
    publish(text, SECTION_START, SECTION_END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
