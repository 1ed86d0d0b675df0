"""What every live collector hands back besides its frame: the gaps and the commands it ran.

A collector never turns "could not look" into "nothing there". When a piece of evidence
could not be read (py-spy absent, ptrace denied, a host that dropped, a command cut at
its byte cap) the collector records a :class:`Gap` naming the piece, the target, the
reason and the fix, and keeps everything it did read. The bundle writes the gaps and the
command records into its manifest; the diagnosis reads the gaps to decide whether a
verdict can be reached (a missing piece that mattered makes it INCONCLUSIVE).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from forensics import evidence_display
from forensics.hosts.result import CommandResult
from forensics.redact import redact_argv, redact_text

PIECES = ("metrics", "probes", "loads", "server_info", "threads", "logs", "settings", "processes")


@dataclass(frozen=True)
class Gap:
    """A piece of evidence that could not be collected (or only in part), and why."""

    piece: str  # one of PIECES
    target: str  # the engine and host it concerns, e.g. "prefill-0 (ssh://ops@10.0.3.17:22)"
    reason: str  # what happened, in words: "py-spy is not installed on ssh://..."
    fix: str | None = None  # what to do about it, when we know
    state: str | None = None  # the CommandResult state behind it, when a command failed
    partial: bool = False  # True: some of the piece was read (kept), the rest is missing

    def __post_init__(self) -> None:
        if self.piece not in PIECES:
            raise ValueError(f"Gap.piece must be one of {PIECES}, got {self.piece!r}")
        # A reason quotes what failed (a command line, a URL, an error text): every Gap is
        # redacted here, so no collector can forget to (redaction is idempotent).
        for name in ("target", "reason", "fix"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, redact_text(value))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        text = f"{self.piece} for {self.target}: {self.reason}"
        return text + (f" (fix: {self.fix})" if self.fix else "")


def command_record(result: CommandResult) -> dict[str, Any]:
    """A CommandResult as the manifest keeps it: what ran where, and how it ended (no output)."""
    return {
        "host": result.host,
        "argv": redact_argv(result.argv),
        "command_line": redact_text(result.command_line),
        "state": result.state.value,
        "exit_code": result.exit_code,
        "duration_s": round(result.duration_s, 6),
        "truncated": result.truncated,
        "error": redact_text(result.error) if isinstance(result.error, str) else result.error,
        "stdout_bytes": len(result.stdout),
        "stderr_bytes": len(result.stderr),
    }


# The frames an Evidence set can hold (all optional): the bundle stores each as Parquet and
# the diagnosis reads them by these names, so a live collection and a bundle read alike.
FRAMES = (
    "engines",  # one row per engine of the inventory: name, role, host, url
    "probes",  # forensics.probes: one row per probe
    "metrics",  # forensics.collectors.metrics SAMPLES_SCHEMA
    "scrapes",  # forensics.collectors.metrics SCRAPES_SCHEMA
    "prometheus",  # the PD queue series over the window from the inventory's Prometheus server (same schema as metrics)
    "loads",  # /v1/loads rows per engine and DP rank
    "server_info",  # one row per engine: version, backend, JSON of what /server_info said (redacted)
    "processes",  # engine processes found: engine, role, host, pid, start_time, cmdline
    "threads",  # py-spy dumps: one row per thread
    "thread_check",  # expected threads against the dumps
    "logged_threads",  # expected threads against the dumps sglang printed into its logs (of_process: running/earlier/unknown)
    "events",  # log events (forensics.logs EVENTS schema) from every engine's log
    "log_findings",  # forensics.logs findings over the window
    "settings",  # versions, PD env and server args (redacted)
    "setting_findings",  # risky settings
)


@dataclass
class Evidence:
    """Everything collected about one deployment in one window: frames, gaps, commands.

    What ``forensics collect`` writes as a bundle and what ``forensics diagnose`` reads;
    ``frames`` maps names in :data:`FRAMES` to DataFrames (a piece never collected is absent,
    and a :class:`Gap` says why).
    """

    deployment: dict[str, Any]  # name, sglang, backend, inventory path (never secrets)
    frames: dict[str, Any] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    window: dict[str, str | None] = field(default_factory=dict)  # since/until as ISO text
    collected_at: str | None = None  # ISO UTC

    def frame(self, name: str):
        """The frame ``name``, or None when it was not collected."""
        if name not in FRAMES:
            raise KeyError(f"no evidence frame {name!r} (known: {', '.join(FRAMES)})")
        return self.frames.get(name)

    def gaps_for(self, piece: str) -> list[Gap]:
        return [gap for gap in self.gaps if gap.piece == piece]

    @property
    def known_frames(self) -> tuple[str, ...]:
        """Every frame name an Evidence may hold, in their documented order (:data:`FRAMES`)."""
        return FRAMES

    def __repr__(self) -> str:
        held = ", ".join(f"{name}={len(frame)}" for name, frame in self.frames.items())
        return f"<Evidence {self.deployment.get('name')!r}: {held}; {len(self.gaps)} gap(s)>"

    def _repr_html_(self) -> str:
        """JupyterLab: deployment, time, engines, frames with row counts, gaps highlighted (redacted, escaped)."""
        return evidence_display.to_html(self)

    def __rich__(self):
        return evidence_display.renderable(self)
