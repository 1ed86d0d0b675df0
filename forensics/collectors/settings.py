"""Versions and settings of an engine, and the ones that are risky for PD disaggregation.

Three sources, one long frame (:data:`SETTINGS_SCHEMA`: engine, source, name, value, risky):

* ``version``: sglang's version from ``/server_info``, else from the engine's interpreter
  on its host (``PYTHON -c "import importlib.metadata as m; print(m.version('sglang'))"``);
* ``server_args``: the server args that matter (``disaggregation_*``, ``watchdog_timeout``,
  ``enable_metrics``, ``dist_timeout``, ... and ``api_key``/``admin_api_key``, redacted) from
  an :class:`~forensics.collectors.engine_state.EngineState`;
* ``env``: the PD environment variables of the engine process, read from
  ``/proc/PID/environ`` with ``cat`` on its host (``sudo=True`` where permission is
  denied). sglang's schedulers retitle themselves with setproctitle, which blanks their
  ``/proc/PID/environ``; a blank one is read again from the parent (the launcher, whose
  environment the schedulers inherited). Only the names in :data:`ENV_PREFIXES` and
  :data:`ENV_NAMES` are kept, and anything secret-looking among them is redacted.

:func:`assess` turns them into :class:`Finding` objects, each with its evidence and why it
is risky (docs/settings.md lists the rules); rows a finding cites have ``risky = True``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
from packaging.version import InvalidVersion, Version

from forensics.collectors.engine_state import EngineState
from forensics.evidence import Gap, command_record
from forensics.hosts.base import Host
from forensics.hosts.result import CommandResult, State
from forensics.redact import REDACTED, is_secret_name, redact_env, redact_text, redact_value

__all__ = [
    "ENV_NAMES",
    "ENV_PREFIXES",
    "SERVER_ARG_NAMES",
    "SETTINGS_SCHEMA",
    "Finding",
    "Settings",
    "assess",
    "collect_settings",
    "combine",
    "parse_environ",
    "read_environ",
    "select_env",
    "select_server_args",
]

SETTINGS_SCHEMA: dict[str, str] = {
    "engine": "string",
    "source": "string",  # "env", "server_args" or "version"
    "name": "string",
    "value": "string",  # as read, secrets redacted; "None" for a server arg that is None
    "risky": "bool",  # a finding cites this row
}

ENV_PREFIXES = ("SGLANG_DISAGGREGATION_", "SGLANG_DISAGG_", "UCX_", "NIXL_", "MOONCAKE_")
ENV_NAMES = frozenset({
    "SGLANG_HEALTH_CHECK_TIMEOUT", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "SGLANG_DIAG_BYPASS_HEALTH_GENERATE",
    "SGLANG_REQ_WAITING_TIMEOUT", "SGLANG_REQ_RUNNING_TIMEOUT", "SGLANG_ENABLE_FAILED_SESSION_PROBE",
    "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", "SGLANG_LOG_MS", "SGLANG_LOG_FORWARD_ITERS",
    "SGLANG_LOGGING_CONFIG_PATH", "SGLANG_DISAGG_STAGING_BUFFER",
})
SERVER_ARG_PREFIXES = ("disaggregation_",)
SERVER_ARG_NAMES = frozenset({
    "watchdog_timeout", "soft_watchdog_timeout", "dist_timeout", "enable_metrics", "enable_metrics_for_all_schedulers",
    "decode_log_interval", "log_level", "log_level_http", "num_reserved_decode_tokens", "optimistic_prefill_retries",
    "tp_size", "dp_size", "pp_size", "enable_dp_attention", "host", "port", "model_path", "served_model_name",
    "api_key", "admin_api_key",
})

VULNERABLE = (Version("0.5.13"), Version("0.5.16"))  # [0.5.13, 0.5.16): 0.5.13 ... 0.5.15.post1
PD_TIMEOUT_LIMIT_S = 600.0
HEALTH_CHECK_TIMEOUT_LIMIT_S = 60.0
WATCHDOG_LIMIT_S = 1800.0
_FALSE = ("0", "false", "no", "off", "")
VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('sglang'))"


@dataclass(frozen=True)
class Finding:
    """One risky setting: what, on which engine, the evidence (rows as ``name=value``), why, and the fix."""

    id: str
    engine: str
    title: str
    evidence: tuple[str, ...]
    why: str
    fix: str | None = None
    severity: str = "warning"  # "critical" (the wedge itself) or "warning"
    rows: tuple[tuple[str, str], ...] = ()  # (source, name) of the rows it cites

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evidence"], d["rows"] = list(self.evidence), [list(r) for r in self.rows]
        return d

    def __str__(self) -> str:
        return f"[{self.severity}] {self.engine}: {self.title} ({'; '.join(self.evidence)}): {self.why}"


@dataclass
class Settings:
    """Versions and settings of one or more engines: the frame, the findings, gaps and commands."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # per engine: host, version, backend, env_pid

    @property
    def frame(self) -> pd.DataFrame:
        return self.to_frame()

    def to_frame(self) -> pd.DataFrame:
        cited = {(f.engine, s, n) for f in self.findings for s, n in f.rows}
        return pd.DataFrame({
            "engine": pd.array([r["engine"] for r in self.rows], dtype="string"),
            "source": pd.array([r["source"] for r in self.rows], dtype="string"),
            "name": pd.array([r["name"] for r in self.rows], dtype="string"),
            "value": pd.array([r["value"] for r in self.rows], dtype="string"),
            "risky": pd.array([(r["engine"], r["source"], r["name"]) in cited for r in self.rows], dtype="bool"),
        })

    def value(self, engine: str, source: str, name: str) -> str | None:
        for r in self.rows:
            if (r["engine"], r["source"], r["name"]) == (engine, source, name):
                return r["value"]
        return None

    def version(self, engine: str) -> str | None:
        return self.engines.get(engine, {}).get("version")

    def backend(self, engine: str) -> str | None:
        return self.engines.get(engine, {}).get("backend")

    def to_dict(self) -> dict[str, Any]:
        return {"engines": self.engines, "rows": [dict(r, risky=bool(x)) for r, x in
                                                  zip(self.rows, self.to_frame()["risky"].tolist())],
                "findings": [f.to_dict() for f in self.findings], "gaps": [g.to_dict() for g in self.gaps],
                "commands": self.commands}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    def __repr__(self) -> str:
        return (f"<Settings {len(self.engines)} engine(s), {len(self.rows)} rows, {len(self.findings)} finding(s), "
                f"{len(self.gaps)} gap(s)>")

    def _repr_html_(self) -> str:
        items = "".join(f"<li><b>{html.escape(f.engine)}</b>: {html.escape(f.title)} "
                        f"<code>{html.escape('; '.join(f.evidence))}</code>: {html.escape(f.why)}</li>"
                        for f in self.findings) or "<li>no risky setting found</li>"
        gaps = "".join(f"<li>{html.escape(str(g))}</li>" for g in self.gaps)
        return (f"<h4>Findings</h4><ul>{items}</ul>" + (f"<h4>Gaps</h4><ul>{gaps}</ul>" if gaps else "")
                + self.to_frame().to_html(index=False))


# ------------------------------------------------------------------------------------- reading


def parse_environ(data: bytes) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated ``NAME=value``) as a dict, unredacted: select before keeping."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq and name:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def select_env(env: Mapping[str, str]) -> dict[str, str]:
    """The PD-relevant variables only (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`), secrets redacted."""
    kept = {k: v for k, v in env.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return dict(sorted(redact_env(kept).items()))


def select_server_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The server args that matter (``disaggregation_*`` and :data:`SERVER_ARG_NAMES`), secrets redacted."""
    kept = {k: v for k, v in args.items()
            if k in SERVER_ARG_NAMES or k.startswith(SERVER_ARG_PREFIXES) or is_secret_name(k)}
    return dict(sorted(redact_value(kept).items()))


def _denied(result: CommandResult) -> bool:
    text = result.stderr_text.lower()
    return "permission denied" in text or "operation not permitted" in text or "password is required" in text


def read_environ(host: Host, pid: int, *, sudo: bool = False, timeout: float = 20.0, target: str | None = None,
                 commands: list | None = None) -> tuple[dict[str, str] | None, Gap | None]:
    """The environment of ``pid`` on ``host`` (unredacted, for :func:`select_env`), or a Gap saying why not.

    An empty dict means the file was read and blank (a retitled process): the caller may
    try the parent.
    """
    target = target or host.name
    result = host.run(["cat", f"/proc/{pid}/environ"], timeout=timeout, sudo=sudo, max_bytes=4 * 1024 * 1024)
    if commands is not None:
        commands.append(command_record(result))
    if result.ok:
        return parse_environ(result.stdout), (
            Gap("settings", target, f"/proc/{pid}/environ on {host.name} was cut at 4 MiB", partial=True,
                state=result.state.value) if result.truncated else None)
    reason = result.error or (result.stderr_text.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
    if result.state is State.FAILED and _denied(result):
        fix = ("sudo = true (the user needs a sudoers rule for cat /proc/*/environ)" if not sudo else
               "allow the user `sudo -n cat /proc/*/environ` in sudoers")
        return None, Gap("settings", target, f"permission denied reading /proc/{pid}/environ on {host.name} "
                         f"({redact_text(reason)})", fix=fix, state=result.state.value)
    if result.state is State.FAILED and "no such file" in reason.lower():
        return None, Gap("settings", target, f"process {pid} is gone from {host.name}", state=result.state.value,
                         fix="find the engine's processes again")
    return None, Gap("settings", target, f"could not read /proc/{pid}/environ on {host.name}: {redact_text(reason)}",
                     state=result.state.value)


def read_version(host: Host, python: str, *, timeout: float = 60.0, target: str | None = None,
                 commands: list | None = None) -> tuple[str | None, Gap | None]:
    """sglang's version as installed for ``python`` on ``host``."""
    target = target or host.name
    result = host.run([python, "-c", VERSION_SCRIPT], timeout=timeout)
    if commands is not None:
        commands.append(command_record(result))
    text = result.stdout_text.strip()
    if result.ok and text:
        return text.splitlines()[-1].strip(), None
    reason = result.error or (result.stderr_text.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
    return None, Gap("settings", target, f"sglang version unknown: {python} on {host.name}: {redact_text(reason)}",
                     fix="set python = the engine's interpreter in the inventory", state=result.state.value)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def collect_settings(
    engine: str,
    *,
    host: Host | None = None,
    state: EngineState | None = None,
    pid: int | None = None,
    ppid: int | None = None,
    python: str | None = None,
    backend: str | None = None,
    sudo: bool = False,
    timeout: float = 20.0,
) -> Settings:
    """Versions and settings of one engine, with the findings of :func:`assess` for it alone.

    ``state``: its :class:`EngineState` (server args, version); ``host`` and ``pid``: where
    to read ``/proc/PID/environ`` (``ppid``: the parent, read when the process's own is
    blank); ``python``: its interpreter, asked for the version when ``/server_info`` has
    none; ``backend``: the inventory's, when the server args do not say.
    """
    out = Settings()
    target = f"{engine} ({host.name})" if host is not None else engine
    info: dict[str, Any] = {"host": host.name if host is not None else None}
    out.engines[engine] = info
    version = state.version if state is not None else None
    version_source = "server_info" if version else None
    if version is None and python and host is not None:
        version, gap = read_version(host, python, timeout=max(timeout, 60.0), target=target, commands=out.commands)
        version_source = "python" if version else None
        if gap:
            out.gaps.append(gap)
    elif version is None:
        out.gaps.append(Gap("settings", target, "sglang version unknown: no /server_info answer and no interpreter "
                            "to ask", fix="set python = the engine's interpreter in the inventory"))
    info["version"], info["version_source"] = version, version_source
    if version is not None:
        out.rows.append({"engine": engine, "source": "version", "name": "sglang", "value": redact_text(version)})

    args = select_server_args(state.server_args) if state is not None and state.server_info is not None else None
    if args is not None:
        for name, value in args.items():
            out.rows.append({"engine": engine, "source": "server_args", "name": name, "value": _text(value)})
        backend = args.get("disaggregation_transfer_backend") or backend
    elif state is not None:
        out.gaps.append(Gap("settings", target, "server args unknown: /server_info was not read "
                            f"({state.status.get('server_info', 'not asked')})"))
    info["backend"] = backend
    info["server_args_read"] = args is not None

    env = None
    if host is not None and pid is not None:
        raw, gap = read_environ(host, pid, sudo=sudo, timeout=timeout, target=target, commands=out.commands)
        info["env_pid"] = pid
        if raw == {} and ppid and ppid > 1:  # blanked by setproctitle: the parent's is the one inherited
            raw, gap = read_environ(host, ppid, sudo=sudo, timeout=timeout, target=target, commands=out.commands)
            info["env_pid"] = ppid
        if raw == {}:
            gap = Gap("settings", target, f"/proc/{info['env_pid']}/environ on {host.name} is blank "
                      "(the process retitled itself)", fix="give the parent's pid (ppid) or the launcher's pid")
            raw = None
        if gap:
            out.gaps.append(gap)
        if raw is not None:
            env = select_env(raw)
            for name, value in env.items():
                out.rows.append({"engine": engine, "source": "env", "name": name, "value": value})
    else:
        out.gaps.append(Gap("settings", target, "environment not read: no host and pid given",
                            fix="find the engine's processes first (forensics.collectors.processes)"))
    info["env_read"] = env is not None
    out.findings = assess(out)
    return out


def combine(parts: Iterable[Settings]) -> Settings:
    """Several engines' settings in one, with the cross-engine findings (multi-node NIXL) added."""
    out = Settings()
    for part in parts:
        out.rows += part.rows
        out.gaps += part.gaps
        out.commands += part.commands
        out.engines.update(part.engines)
    out.findings = assess(out)
    return out


# ------------------------------------------------------------------------------------- findings


def _seconds(value: str | None) -> float | None:
    if value is None or value in ("None", REDACTED):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def assess(settings: Settings) -> list[Finding]:
    """The risky settings among ``settings``' rows (rules in docs/settings.md)."""
    findings: list[Finding] = []
    for engine, info in settings.engines.items():
        def get(source: str, name: str, engine: str = engine) -> str | None:
            return settings.value(engine, source, name)

        version, backend = info.get("version"), info.get("backend")
        try:
            parsed = Version(version) if version else None
        except InvalidVersion:
            parsed = None
        if parsed is not None and VULNERABLE[0] <= parsed < VULNERABLE[1] and backend == "nixl":
            findings.append(Finding(
                "vulnerable_release", engine, f"sglang {version} with the NIXL backend can wedge on an ABORT",
                (f"sglang={version}", "disaggregation_transfer_backend=nixl"),
                "0.5.13 to 0.5.15.post1: the decode sends ABORT frames, but the NIXL prefill bootstrap loop has no "
                "ABORT case; it hits `assert frame[0] == GUARD`, the bootstrap thread dies, and every later request "
                "hangs while /health stays 200.",
                "upgrade prefill and decode to 0.5.16 or later, or deploy the patched nixl/conn.py (forensics patch)",
                "critical", (("version", "sglang"), ("server_args", "disaggregation_transfer_backend"))))
        for name, side in (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "decode, WaitingForInput"),
                           ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "prefill, Bootstrapping")):
            seconds = _seconds(get("env", name))
            if seconds is not None and seconds > PD_TIMEOUT_LIMIT_S:
                why = (f"a request stuck in {side} waits {seconds:g} s (default 300) before it fails, so a transfer "
                       "error or a dead peer shows as a hang to clients instead of an error.")
                if name.endswith("WAITING_TIMEOUT"):
                    why += " In 0.5.13+ its expiry is also what sends the ABORT, so the wedge surfaces that much later."
                findings.append(Finding("pd_timeout_high", engine, f"{name} is {seconds:g} s",
                                        (f"{name}={get('env', name)}",), why,
                                        f"keep it at or below {PD_TIMEOUT_LIMIT_S:g} s (default 300)",
                                        rows=(("env", name),)))
        seconds = _seconds(get("env", "SGLANG_HEALTH_CHECK_TIMEOUT"))
        if seconds is not None and seconds > HEALTH_CHECK_TIMEOUT_LIMIT_S:
            findings.append(Finding(
                "health_check_timeout_high", engine, f"SGLANG_HEALTH_CHECK_TIMEOUT is {seconds:g} s",
                (f"SGLANG_HEALTH_CHECK_TIMEOUT={get('env', 'SGLANG_HEALTH_CHECK_TIMEOUT')}",),
                f"/health waits up to {seconds:g} s (default 20) for its probe before answering 503: an orchestrator's "
                "probe times out first, or a failing engine looks alive that long.",
                "keep the default (20 s)", rows=(("env", "SGLANG_HEALTH_CHECK_TIMEOUT"),)))
        generation = get("env", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION")
        if generation is not None and generation.strip().lower() in _FALSE:
            findings.append(Finding(
                "health_generation_disabled", engine, "/health answers 200 without a probe",
                (f"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION={generation}",),
                "with generation disabled /health returns 200 at once, whatever the scheduler does; "
                "only /health_generate still runs a (fake-transfer) probe.",
                "unset it (default true), and probe /health_generate",
                rows=(("env", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"),)))
        if info.get("server_args_read"):
            watchdog = get("server_args", "watchdog_timeout")
            seconds = _seconds(watchdog)
            if watchdog is not None and (seconds is None or seconds <= 0 or seconds > WATCHDOG_LIMIT_S):
                state = "off" if seconds is None or seconds <= 0 else f"{seconds:g} s"
                findings.append(Finding(
                    "watchdog_off", engine, f"the scheduler watchdog is {state}", (f"watchdog_timeout={watchdog}",),
                    "the watchdog kills an engine whose forward pass is stuck (default 300 s); off or huge, a stuck "
                    "scheduler stays up serving nothing.", "keep --watchdog-timeout at its default (300)",
                    rows=(("server_args", "watchdog_timeout"),)))
            metrics = get("server_args", "enable_metrics")
            if metrics is not None and metrics.strip().lower() in _FALSE + ("none",):
                findings.append(Finding(
                    "metrics_disabled", engine, "metrics are disabled", (f"enable_metrics={metrics}",),
                    "without --enable-metrics there is no /metrics: no queue gauges (bootstrap, prealloc, transfer) "
                    "to see requests pile up.", "start the engine with --enable-metrics",
                    rows=(("server_args", "enable_metrics"),)))
    findings += _multi_node_nixl(settings)
    return findings


def _multi_node_nixl(settings: Settings) -> list[Finding]:
    """NIXL between prefill and decode on different hosts with no UCX_NET_DEVICES on an engine."""
    engines = settings.engines
    hosts = {info.get("host") for info in engines.values() if info.get("host")}
    if len(hosts) < 2 or not any(info.get("backend") == "nixl" for info in engines.values()):
        return []
    roles = {info.get("role") or name.split("-")[0] for name, info in engines.items()}
    if not ({"prefill", "decode"} <= roles):
        return []
    found = []
    for engine, info in engines.items():
        if info.get("backend") != "nixl" or not info.get("env_read"):
            continue
        if settings.value(engine, "env", "UCX_NET_DEVICES") is None:
            others = sorted(h for h in hosts if h != info.get("host"))
            found.append(Finding(
                "multi_node_nixl_without_ucx_net_devices", engine, "NIXL across hosts without UCX_NET_DEVICES",
                (f"host={info.get('host')}", f"peer hosts={', '.join(others)}", "UCX_NET_DEVICES unset"),
                "prefill and decode run on different hosts and UCX picks the transport itself: it may choose a slow "
                "TCP interface or a device the peer cannot reach, so transfers crawl or time out.",
                "set UCX_NET_DEVICES to the RDMA devices (e.g. mlx5_0:1) on every engine"))
    return found
