"""Time windows over logs: ``--since``, ``--until`` and ``--last``, read as journalctl reads them.

A bound is an ISO time (naive ones are read in the user's zone), epoch seconds
(``1767225600`` or ``@1767225600``), ``now``/``today``/``yesterday``, or a duration
before now (``30m``, ``-2h``, ``90s``, ``1d``, ``2h30m``, ``30 min ago``). ``--last 30m``
is different: the last 30 minutes *of the logs themselves*, ending at their last line.
Anything that cannot mean a time is a ``UsageProblem`` (exit 2) that quotes the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from forensics.exitcodes import UsageProblem

_UNITS = {
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "m": "min", "min": "min", "mins": "min", "minute": "min", "minutes": "min",
    "h": "h", "hr": "h", "hour": "h", "hours": "h",
    "d": "D", "day": "D", "days": "D",
    "w": "W", "week": "W", "weeks": "W",
}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)")
_EPOCH = re.compile(r"@?(\d{9,11}(?:\.\d+)?)")


def parse_duration(text: str, option: str = "--last") -> pd.Timedelta:
    """``30m``, ``2h30m``, ``90s``, ``1.5h``, ``30 min``: a positive duration.

    A sign is refused (``-1s`` is a usage error naming ``option``, never read as 1 s); a bound
    before now (``--since -2h``, ``2h ago``) is :func:`parse_bound`'s to read."""
    value = text.strip().lower()
    if value.startswith(("-", "+")):
        raise UsageProblem(f"{option} {text!r}: a duration has no sign (examples: 30m, 2h, 90s, 1d, 2h30m)")
    total = pd.Timedelta(0)
    position = 0
    for match in _DURATION_PART.finditer(value):
        if match.start() != position or match.group(2) not in _UNITS:
            break
        total += pd.Timedelta(float(match.group(1)), unit=_UNITS[match.group(2)])
        position = match.end()
    if not value or position != len(value) or total <= pd.Timedelta(0):
        raise UsageProblem(f"{option} {text!r}: not a duration (examples: 30m, 2h, 90s, 1d, 2h30m)")
    return total


def parse_bound(text, tz: str = "UTC", option: str = "--since", now: pd.Timestamp | None = None) -> pd.Timestamp:
    """One bound of a window as a tz-aware UTC time."""
    if isinstance(text, pd.Timestamp):
        stamp = text
    elif isinstance(text, (int, float)) and not isinstance(text, bool):
        # A number is epoch seconds, as documented (time.time()); pandas alone would read it as
        # nanoseconds and put the bound in 1970.
        stamp = pd.Timestamp(text, unit="s", tz="UTC")
    elif not isinstance(text, str):
        stamp = pd.Timestamp(text)
    else:
        value = text.strip()
        if not value:
            raise UsageProblem(f"{option} is empty: give a time (2025-07-01T12:00, @1751371200) or a duration (30m)")
        now = now if now is not None else pd.Timestamp.now(tz="UTC")
        lowered = value.lower()
        if lowered == "now":
            return now
        if lowered in ("today", "yesterday", "tomorrow"):
            midnight = now.tz_convert(tz).normalize()
            shift = {"today": 0, "yesterday": -1, "tomorrow": 1}[lowered]
            return (midnight + pd.Timedelta(days=shift)).tz_convert("UTC")
        epoch = _EPOCH.fullmatch(value)
        if epoch:
            return pd.Timestamp(float(epoch.group(1)), unit="s", tz="UTC")
        if value[0] in "+-" or lowered.endswith(" ago") or re.fullmatch(r"[\d.]+\s*[a-z]+(?:\s*[\d.]+\s*[a-z]+)*",
                                                                         lowered):
            if value.startswith("+"):
                return now + parse_duration(value[1:], option)
            before = value[1:] if value.startswith("-") else value[:-4] if lowered.endswith(" ago") else value
            return now - parse_duration(before, option)
        try:
            stamp = pd.Timestamp(value)
        except (ValueError, TypeError) as exc:
            raise UsageProblem(f"{option} {text!r}: not a time ({exc})") from None
    if stamp is pd.NaT or pd.isna(stamp):
        raise UsageProblem(f"{option} {text!r}: not a time")
    if stamp.tzinfo is None:
        try:
            stamp = stamp.tz_localize(tz, ambiguous="raise", nonexistent="raise")
        except Exception as exc:  # noqa: BLE001 - pytz/zoneinfo raise several kinds here
            raise UsageProblem(f"{option} {text!r}: not a single time in {tz} ({exc})") from None
    return stamp.tz_convert("UTC")


@dataclass(frozen=True)
class Window:
    """The bounds asked for: absolute bounds now, ``last`` resolved once the logs' end is known."""

    since: pd.Timestamp | None = None
    until: pd.Timestamp | None = None
    last: pd.Timedelta | None = None

    @property
    def empty(self) -> bool:
        return self.since is None and self.until is None and self.last is None

    def resolve(self, end_of_logs: pd.Timestamp | None) -> Window:
        """Turn ``last`` into a ``since`` relative to the logs' last timed line."""
        if self.last is None:
            return self
        if end_of_logs is None:
            return self  # no timed line: nothing to anchor to; the verdict says so
        since = end_of_logs - self.last
        if self.since is not None:
            since = max(since, self.since)
        return Window(since=since, until=self.until, last=self.last)

    def describe(self) -> str:
        parts = []
        if self.last is not None and self.since is None:
            parts.append(f"the last {_duration_text(self.last)} of the logs")
        if self.since is not None:
            parts.append(f"from {self.since.isoformat()}")
        if self.until is not None:
            parts.append(f"until {self.until.isoformat()}")
        return " ".join(parts) or "everything"

    def to_dict(self) -> dict:
        return {"since": None if self.since is None else self.since.isoformat(),
                "until": None if self.until is None else self.until.isoformat(),
                "last_s": None if self.last is None else self.last.total_seconds()}


def _duration_text(delta: pd.Timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def window(since=None, until=None, last=None, tz: str = "UTC", now: pd.Timestamp | None = None) -> Window:
    """Read the three options into a Window; contradictions are usage problems."""
    start = None if since is None else parse_bound(since, tz, "--since", now)
    end = None if until is None else parse_bound(until, tz, "--until", now)
    duration = None
    if last is not None:
        duration = last if isinstance(last, pd.Timedelta) else parse_duration(str(last))
    if start is not None and end is not None and end < start:
        raise UsageProblem(f"--until {end.isoformat()} is before --since {start.isoformat()}: the window is empty")
    return Window(since=start, until=end, last=duration)
