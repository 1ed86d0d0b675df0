"""Capture a PD deployment's observable surface: what a reader of its outside can see.

A :class:`Capture` is plain data (JSON as is), so a real engine's capture can be stored as a
test fixture and compared with a twin's captured minutes later on another machine:

* ``metrics``: per role, every ``/metrics`` family with its ``# TYPE``, label names and the
  sample names it carries, read by the collectors' own parser (``parse_exposition``);
* ``endpoints``: per role, each informational route's status and its answer's keys;
* ``generate``: the keys of a ``/generate`` answer and of its ``meta_info``;
* ``processes``: per role, each process of the engine's tree (the HTTP server and its
  children): its title as ``ps`` shows it, normalised, and its threads' names (``py-spy dump``
  through :func:`forensics.threads.dump.dump_threads`);
* ``logs``: per event of :mod:`forensics.fidelity.scenario`, per role, the lines the log grew by.

Targets come from URLs, pids and log files (:class:`Target`) or from an inventory
(:meth:`Target.from_inventory`), so a real deployment written by ``twin up --engine sglang`` and
a twin are captured the same way.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import psutil

from forensics.collectors.metrics import labels_dict, parse_exposition
from forensics.collectors.renames import SAMPLE_SUFFIXES
from forensics.exitcodes import Undecided
from forensics.fidelity.scenario import EVENTS, Marks

SERVER_ROLES = ("prefill", "decode")
# The informational routes a PD server answers (sglang's entrypoints/http_server.py spellings,
# both the old get_ and the new names), compared by status and by their answers' keys.
ENDPOINTS = ("/health", "/health_generate", "/get_server_info", "/server_info", "/get_model_info", "/model_info",
             "/v1/models", "/get_load", "/v1/loads", "/metrics")
# Routes that may block on a wedged engine; captured while it serves.
HTTP_TIMEOUT_S = 30.0
_NUMBERED_THREAD = re.compile(r"^Thread-\d+")


class CaptureError(Undecided):
    """A side could not be captured (its process or URL is gone): nothing to compare, exit 3."""


@dataclass
class RoleTarget:
    role: str
    url: str
    log_file: Path | None = None
    pid: int | None = None  # a process of the engine; found by its port when None

    def leader(self) -> psutil.Process:
        """The process serving the URL, whose tree the capture reads (sglang's HTTP server, with its
        scheduler, detokenizer and resource tracker under it)."""
        port = urlparse(self.url).port
        if self.pid is not None:
            try:
                proc = psutil.Process(self.pid)
            except psutil.Error as exc:
                raise CaptureError(f"{self.role}: pid {self.pid} is not running ({exc})") from None
            # An inventory's pid file names the scheduler (where bootstrap_thread runs, py-spy's
            # target); its tree would hold that process alone, so climb to the one listening.
            try:
                lineage = [proc, *proc.parents()]
            except psutil.Error:
                lineage = [proc]
            return next((p for p in lineage if _listens(p, port)), proc)
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
        raise CaptureError(f"{self.role}: no process listens on {self.url}")


def _listens(proc: psutil.Process, port: int | None) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in proc.net_connections("tcp"))
    except psutil.Error:
        return False


@dataclass
class Target:
    """Where a deployment's roles answer, log and run."""

    name: str  # "real" or "twin": how the report names this side
    release: str
    router: str
    roles: dict[str, RoleTarget] = field(default_factory=dict)
    waiting_timeout_s: float = 300.0  # the decode's SGLANG_DISAGGREGATION_WAITING_TIMEOUT (sglang's default)

    @classmethod
    def from_inventory(cls, path: str | Path, name: str | None = None) -> Target:
        from forensics.inventory import load

        inv = load(path)
        roles = {}
        for role in SERVER_ROLES:
            engine = inv.engine(role)
            pid = None
            if engine.pid_file:
                try:
                    pid = int(Path(engine.pid_file).read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    pid = None
            roles[role] = RoleTarget(role, engine.url, Path(engine.log_file) if engine.log_file else None, pid)
        router = inv.engine("router").url
        settings = inv.twin or {}
        engine_kind = settings.get("engine", "twin")
        timeout = settings.get("waiting_timeout_s", settings.get("waiting_timeout", 300.0))
        return cls(name or ("real" if engine_kind == "sglang" else "twin"), inv.sglang or "", router, roles,
                   float(timeout))

    def logs(self) -> dict[str, Path]:
        return {role: t.log_file for role, t in self.roles.items() if t.log_file is not None}


def fetch(url: str, timeout: float = HTTP_TIMEOUT_S) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return None, repr(exc).encode()


def answer_keys(body: bytes) -> list[str] | None:
    """The keys of a JSON answer (of its first element when it is a list; of ``data[0]`` too)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, list):
        data = data[0] if data and isinstance(data[0], dict) else {}
    if not isinstance(data, dict):
        return None
    keys = sorted(data)
    if isinstance(data.get("data"), list) and data["data"] and isinstance(data["data"][0], dict):
        keys += [f"data[].{k}" for k in sorted(data["data"][0])]
    return keys


def metric_families(page: bytes | str) -> dict[str, dict]:
    """Family -> {"type", "labels" (names), "samples" (sample names)} of one ``/metrics`` page."""
    parsed = parse_exposition(page, strict=True)  # a capture is exact: an unreadable line stops it
    families: dict[str, dict] = {
        name: {"type": kind, "labels": set(), "samples": set()} for name, kind in parsed.types.items()}
    for metric, labels in zip(parsed.metric, parsed.labels, strict=True):
        family = metric if metric in families else next(
            (metric[: -len(s)] for s in SAMPLE_SUFFIXES if metric.endswith(s) and metric[: -len(s)] in families),
            metric)
        entry = families.setdefault(family, {"type": "untyped", "labels": set(), "samples": set()})
        entry["samples"].add(metric)
        entry["labels"].update(k for k in labels_dict(labels) if k not in ("le", "quantile"))
    return {name: {"type": e["type"], "labels": sorted(e["labels"]), "samples": sorted(e["samples"])}
            for name, e in sorted(families.items())}


def process_title(cmdline: list[str]) -> str:
    """What identifies a process in ``ps``: its setproctitle, or ``python -m MODULE``, or its script."""
    if not cmdline:
        return "?"
    if len(cmdline) == 1 or not cmdline[0].startswith("/"):
        title = " ".join(cmdline).strip()
        if title.startswith("sglang::") or not cmdline[0].endswith(("python", "python3")):
            return title.split()[0] if title.startswith("sglang::") else title
    if "-m" in cmdline[1:]:
        index = cmdline.index("-m", 1)
        if index + 1 < len(cmdline):
            return f"python -m {cmdline[index + 1]}"
    if "-c" in cmdline[1:]:
        snippet = cmdline[cmdline.index("-c", 1) + 1] if cmdline.index("-c", 1) + 1 < len(cmdline) else ""
        return "python -c " + snippet.split(";")[0].strip()[:60]
    return f"python {Path(cmdline[1]).name}" if len(cmdline) > 1 else Path(cmdline[0]).name


def thread_name(name: str | None) -> str:
    """``Thread-7 (transfer_worker)`` -> ``Thread-N (transfer_worker)``: numbers differ per run."""
    return _NUMBERED_THREAD.sub("Thread-N", name or "?")


def _py_spy() -> str:
    import sys

    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")


def processes(target: RoleTarget, *, py_spy: str | None = None) -> list[dict]:
    """The engine's process tree: title, pid, thread names (sorted), or why they are unknown."""
    from forensics.hosts.local import LocalHost
    from forensics.threads.dump import dump_threads

    leader = target.leader()
    tree = [leader, *leader.children(recursive=True)]
    rows = []
    host = LocalHost()
    for proc in tree:
        try:
            title = process_title(proc.cmdline())
        except psutil.Error:
            continue
        if title.startswith("py-spy"):
            continue
        dump = dump_threads(host, proc.pid, py_spy=py_spy or _py_spy(), timeout=60)
        row = {"title": title, "pid": proc.pid}
        if proc is leader:
            row["leader"] = True
        if dump.ok:
            row["threads"] = sorted(thread_name(n) for n in dump.frame["thread_name"].astype(str))
            row["dump"] = dump.raw[proc.pid]
        else:
            row["threads"] = None
            row["gap"] = str(dump.gaps[proc.pid])
        rows.append(row)
    return rows


@dataclass
class Capture:
    """One side's observable surface (plain data; ``to_dict``/``from_dict`` round-trip as JSON)."""

    name: str
    release: str
    metrics: dict[str, dict] = field(default_factory=dict)  # role -> family -> facts
    endpoints: dict[str, dict] = field(default_factory=dict)  # role -> route -> {"status", "keys"}
    generate: dict[str, list[str]] = field(default_factory=dict)  # "top" / "meta_info" -> keys
    processes: dict[str, list[dict]] = field(default_factory=dict)  # role -> [{"title", "threads"}]
    logs: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # event -> role -> lines
    outcomes: dict[str, str] = field(default_factory=dict)  # event -> what the scenario saw

    def to_dict(self, *, with_dumps: bool = False) -> dict:
        procs = {role: [{k: v for k, v in row.items() if with_dumps or k != "dump"} for row in rows]
                 for role, rows in self.processes.items()}
        return {"name": self.name, "release": self.release, "metrics": self.metrics, "endpoints": self.endpoints,
                "generate": self.generate, "processes": procs, "logs": self.logs, "outcomes": self.outcomes}

    @classmethod
    def from_dict(cls, data: dict) -> Capture:
        return cls(data["name"], data["release"], data.get("metrics", {}), data.get("endpoints", {}),
                   data.get("generate", {}), data.get("processes", {}), data.get("logs", {}),
                   data.get("outcomes", {}))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Capture:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except KeyError as exc:
            raise CaptureError(f"{path}: not a fidelity capture (no {exc} key)") from None
        except (OSError, ValueError) as exc:
            raise CaptureError(f"{path}: not a fidelity capture ({exc})") from None


def capture_metrics(target: Target, into: Capture, pages: dict[str, bytes] | None = None) -> None:
    for role, role_target in target.roles.items():
        status, body = fetch(role_target.url + "/metrics")
        if status != 200:
            raise CaptureError(f"{target.name} {role}: {role_target.url}/metrics answered {status}: {body[:120]!r}")
        into.metrics[role] = metric_families(body)
        if pages is not None:
            pages[role] = body


def capture_endpoints(target: Target, into: Capture, bodies: dict[str, dict[str, bytes]] | None = None) -> None:
    for role, role_target in target.roles.items():
        answers = {}
        for route in ENDPOINTS:
            status, body = fetch(role_target.url + route)
            keys = None if route == "/metrics" or status is None else answer_keys(body)
            answers[route] = {"status": status, "keys": keys}
            if bodies is not None:
                bodies.setdefault(role, {})[route] = body
        into.endpoints[role] = answers


def capture_processes(target: Target, into: Capture) -> None:
    for role, role_target in target.roles.items():
        into.processes[role] = processes(role_target)


def generate_keys(answer: dict | None) -> dict[str, list[str]]:
    if not isinstance(answer, dict):
        return {}
    meta = answer.get("meta_info")
    return {"top": sorted(answer), "meta_info": sorted(meta) if isinstance(meta, dict) else []}


def log_slices(logs: dict[str, Path], marks: Marks) -> dict[str, dict[str, list[str]]]:
    """Event -> role -> the log's lines between the event's marks (decoded as sglang writes: UTF-8)."""
    out: dict[str, dict[str, list[str]]] = {}
    for event in EVENTS:
        for role, path in logs.items():
            start, end = marks.span(event, role)
            with open(path, "rb") as handle:
                handle.seek(start)
                chunk = handle.read(max(0, end - start))
            out.setdefault(event, {})[role] = chunk.decode("utf-8", "replace").splitlines()
    return out


def capture_deployment(target: Target, words, *, raw_dir: str | Path | None = None,
                       death_deadline_s: float = 240.0) -> Capture:
    """Run the scenario on ``target`` and capture its surface along the way.

    After the served request: the endpoints and the threads of every process (a serving
    engine's). After the abort: the threads again (the wedged prefill's), kept only in
    ``raw_dir``. At the end: ``/metrics``. ``raw_dir`` (optional) receives the material as the
    engine wrote it: each role's ``/metrics`` page, endpoint answers and py-spy dumps, for fixtures.
    """
    from forensics.fidelity import scenario

    raw = Path(raw_dir) if raw_dir is not None else None
    if raw is not None:
        raw.mkdir(parents=True, exist_ok=True)
    captured = Capture(target.name, target.release)
    logs = target.logs()
    if set(logs) != set(SERVER_ROLES):
        raise CaptureError(f"{target.name}: the log files of {sorted(set(SERVER_ROLES) - set(logs))} are unknown")

    def on_event(event: str) -> None:
        if event == "served":
            bodies: dict[str, dict[str, bytes]] = {}
            capture_endpoints(target, captured, bodies)
            capture_processes(target, captured)
            if raw is not None:
                for role, answers in bodies.items():
                    for route in ("/server_info", "/get_server_info", "/get_model_info", "/v1/models"):
                        if answers.get(route) and captured.endpoints[role][route]["status"] == 200:
                            (raw / f"{role}{route.replace('/', '-')}.json").write_bytes(answers[route])
        elif event == "waiting_timeout":
            # At the end, not after the served request: real sglang's decode scheduler adds its
            # families to /metrics 10-20 s after the server is ready (measured on 0.5.15: 26 families
            # at first, 64 from then on), and the comparison is of families, not of values.
            pages: dict[str, bytes] = {}
            capture_metrics(target, captured, pages)
            if raw is not None:
                for role, page in pages.items():
                    (raw / f"{role}-metrics.txt").write_bytes(page)
        elif event == "abort" and raw is not None:
            for role in SERVER_ROLES:
                for row in processes(target.roles[role]):
                    if row.get("dump") is not None:
                        name = row["title"].replace("::", "-").replace(" ", "_").replace("/", "_")
                        (raw / f"{role}-wedged-{name}.pyspy.json").write_text(json.dumps(row["dump"], indent=1))

    marks = scenario.run(target.router, logs, words, waiting_timeout_s=target.waiting_timeout_s, on_event=on_event,
                         death_deadline_s=death_deadline_s, decode_url=target.roles["decode"].url)
    captured.generate = generate_keys(marks.generate_answer)
    captured.logs = log_slices(logs, marks)
    captured.outcomes = dict(marks.outcomes)
    if raw is not None:
        (raw / "marks.json").write_text(json.dumps(marks.to_dict(), indent=1))
    return captured
