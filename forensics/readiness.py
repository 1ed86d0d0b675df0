"""Is an inventory usable: every host reached, every URL answering, every log readable, py-spy there.

``forensics init`` runs this on the inventory it wrote (and ``fx.readiness.check(path)`` on any
inventory) so that what would make ``collect`` or ``diagnose`` come back with gaps is found first,
one line per problem with what to do. Nothing here sends a request an engine would act on: a URL is
checked with ``GET /health`` (never ``/generate`` or ``/health_generate``), a host with ``true``,
a journal with ``journalctl -u UNIT -n 1``, py-spy with ``--version``.
"""

from __future__ import annotations

import html
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from forensics.exitcodes import ExitStatus
from forensics.inventory import Inventory, load

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Check:
    """One thing the inventory needs, and whether it holds."""

    what: str  # "host", "url", "journal", "log file", "py-spy"
    target: str  # the host or engine it is about
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"{mark} {self.what} {self.target}: {self.detail}" + ("" if self.ok or not self.fix else
                                                                       f" (fix: {self.fix})")


@dataclass
class Readiness:
    inventory: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.BAD if self.failed else ExitStatus.GOOD

    @property
    def word(self) -> str:
        return "ready" if not self.failed else "not ready"

    def text(self) -> str:
        head = (f"{self.inventory}: ready ({len(self.checks)} checks passed)" if not self.failed else
                f"{self.inventory}: {len(self.failed)} of {len(self.checks)} checks failed")
        return "\n".join([head, *(c.line() for c in self.checks)])

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<Readiness {self.word}: {len(self.checks) - len(self.failed)} of {len(self.checks)} checks passed>"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{'ok' if c.ok else '<b style=color:#c62828>FAIL</b>'}</td><td>{html.escape(c.what)}"
                       f"</td><td>{html.escape(c.target)}</td><td>{html.escape(c.detail)}</td>"
                       f"<td>{html.escape(c.fix)}</td></tr>" for c in self.checks)
        return (f"<p><b>{html.escape(self.word)}</b>: {html.escape(self.inventory)}</p><table><tr><th></th>"
                f"<th>check</th><th>of</th><th>result</th><th>fix</th></tr>{rows}</table>")

    def to_dict(self) -> dict:
        return {"inventory": self.inventory, "ready": not self.failed,
                "checks": [{"what": c.what, "target": c.target, "ok": c.ok, "detail": c.detail, "fix": c.fix}
                           for c in self.checks]}


def check(inventory: str | Path | Inventory, *, timeout: float = TIMEOUT_S, progress=None) -> Readiness:
    """Every check of the inventory (see the module docstring); ``progress(line)`` after each."""
    inv = inventory if isinstance(inventory, Inventory) else load(inventory)
    result = Readiness(str(inv.path or inventory))

    def add(item: Check) -> None:
        result.checks.append(item)
        if progress is not None:
            progress(item.line())

    try:
        reached: dict[str, bool] = {}
        spied: set[tuple[str, str]] = set()
        for engine in inv.engines:
            host_name = _host_label(engine)
            if host_name not in reached:
                reached[host_name] = _host(inv, engine, timeout, add)
            add(_url(inv, engine, timeout))
            if not reached[host_name]:
                continue
            if engine.log_source is not None:
                add(_log(inv, engine, timeout))
            if engine.role in ("prefill", "decode") and (host_name, engine.py_spy) not in spied:
                spied.add((host_name, engine.py_spy))
                add(_py_spy(inv, engine, timeout))
    finally:
        inv.close_hosts()
    return result


def _host_label(engine) -> str:
    """The host as the inventory names it: its [hosts] table, "local", or its ssh:// form."""
    host = engine.host
    if host.kind == "local":
        return "local"
    return host.name or f"ssh://{host.user + '@' if host.user else ''}{host.hostname}:{host.port}"


def _host(inv: Inventory, engine, timeout: float, add) -> bool:
    if engine.host.kind == "local":
        return True  # this machine: nothing to reach
    host = inv.host_for(engine)
    done = host.run(["true"], timeout=timeout)
    if done.ok:
        add(Check("host", _host_label(engine), True, f"reached over SSH in {done.duration_s:.1f} s"))
        return True
    add(Check("host", _host_label(engine), False, f"not reached: {done.error or done.stderr_text.strip()[:200]}",
              "check the address, user, key and known_hosts in its [hosts] table (and its jump host); "
              "`ssh` with the same settings should log in without a password"))
    return False


def _url(inv: Inventory, engine, timeout: float) -> Check:
    url = engine.url.rstrip("/") + "/health"
    config = engine.host.config
    behind_jump = engine.host.kind != "local" and config is not None and bool(config.jump)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - http(s) only, from the inventory
            return Check("url", engine.label, True, f"GET {url}: {answer.status}")
    except urllib.error.HTTPError as exc:  # an answer all the same: the engine is reachable from here
        return Check("url", engine.label, True, f"GET {url}: {exc.code} (reachable; diagnose reads what it means)")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        fix = ("forensics reads engine URLs from this machine, not through the jump host: run it where "
               f"{engine.url} is reachable (on the bastion, or with an SSH tunnel to it)" if behind_jump else
               "is the engine up, and is its URL reachable from this machine?")
        return Check("url", engine.label, False, f"GET {url}: no answer ({reason})", fix)


def _log(inv: Inventory, engine, timeout: float) -> Check:
    spec = engine.log_source
    host = inv.host_for(engine)
    if spec.kind == "unit":
        argv = [engine.journalctl, "-u", str(spec.value), "-n", "1", "--no-pager", "-o", "short-iso"]
        done = host.run(argv, timeout=timeout, sudo=engine.sudo)
        text = done.stdout_text.strip()
        if done.ok and text and "-- No entries --" not in text:
            return Check("journal", engine.label, True, f"{spec.value}: readable")
        if done.ok:
            return Check("journal", engine.label, False, f"{spec.value}: no entries",
                         "is the unit name right (`systemctl list-units 'sglang*'`), and may this user read its "
                         "journal (the systemd-journal group, or sudo = true)?")
        return Check("journal", engine.label, False,
                     f"{spec.value}: {done.error or done.stderr_text.strip().splitlines()[-1:] or done.state}",
                     "journalctl must run there (set journalctl = '/path' in the host's table), with sudo = true "
                     "if only root reads the journal")
    if spec.kind == "file":
        done = host.run(["head", "-c", "1", str(spec.value)], timeout=timeout, sudo=engine.sudo)
        if done.ok:
            return Check("log file", engine.label, True, f"{spec.value}: readable")
        return Check("log file", engine.label, False, f"{spec.value}: {done.stderr_text.strip()[:200] or done.state}",
                     "the path of the engine's stdout/stderr file on its host, readable by this user (or sudo = true)")
    return Check("log", engine.label, True, f"{spec.kind} {spec.value}: not checked before a collection")


def _py_spy(inv: Inventory, engine, timeout: float) -> Check:
    host = inv.host_for(engine)
    done = host.run([engine.py_spy, "--version"], timeout=timeout, sudo=engine.sudo)
    where = _host_label(engine)
    if done.ok:
        return Check("py-spy", where, True, done.stdout_text.strip() or engine.py_spy)
    return Check("py-spy", where, False, f"{engine.py_spy}: {done.error or done.stderr_text.strip()[:160] or 'not found'}",
                 f"pip install py-spy on {where} (into the engine's venv is fine), or set py_spy = '/path' in its "
                 "[hosts] table; without it a thread dump, the wedge's second source, is a gap")
