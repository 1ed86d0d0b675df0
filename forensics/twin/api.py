"""``forensics.twin.up(...)``: start a twin, hand back a :class:`Deployment`, stop it after.

    with fx.twin.up("0.5.15") as twin:
        httpx.post(twin.router + "/v1/completions", json={...})
        twin.restart("prefill")

The twin runs from its own copy of the release's files (``<dir>/site-packages/sglang``;
Python files copied, read-only data files hard-linked: no writable inode is shared with
the cache), so patching that copy and
restarting the prefill changes what runs, as a patch deploy on a live host does.
"""

from __future__ import annotations

import contextlib
import fcntl
import html
import json
import math
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from forensics.exitcodes import EnvironmentProblem, UsageProblem
from forensics.inventory.twin_table import DEFAULT_WAITING_TIMEOUT_S, TwinSettings
from forensics.twin import inventory as inventory_mod
from forensics.twin import processes
from forensics.twin.errors import TwinError

INVENTORY_NAME = "inventory.toml"
# A mixed-version twin: what the prefill's loop did with each decode frame, and how a transfer's end
# reaches the decode (forensics.twin.pair).
PAIR_CHECK_NAME = "pair-check.json"
SUPPORTED_BACKENDS = ("nixl", "mooncake")
PORT_NAMES = ("router", "prefill", "bootstrap", "decode")


# The queue lengths each role's /server_info reports (the gauges sglang exports as metrics).
QUEUE_GAUGES = {"prefill": ("bootstrap_queue", "waiting_queue", "inflight_queue"),
                "decode": ("prealloc_queue", "transfer_queue", "running")}


class TwinStatus(dict):
    """``Deployment.status()``: a plain dict (``status["roles"]["prefill"]["alive"]``, JSON as is)
    that shows itself: the verdict first (healthy or what is wrong), then per role the URL, pid,
    alive / answering, the prefill's bootstrap thread alive or DEAD, and the queue gauges."""

    @property
    def healthy(self) -> bool:
        roles = self.get("roles", {})
        return bool(roles) and all(r.get("alive") and r.get("answering") for r in roles.values()) and (
            roles.get("prefill", {}).get("bootstrap_thread_alive") is True)

    def problems(self) -> list[str]:
        said = []
        for role, entry in self.get("roles", {}).items():
            if not entry.get("alive"):
                said.append(f"{role} is not running")
            elif not entry.get("answering"):
                said.append(f"{role} does not answer")
        thread = self.get("roles", {}).get("prefill", {}).get("bootstrap_thread_alive")
        if thread is False:
            said.append("the prefill's bootstrap thread is dead")
        elif thread is None and self.get("roles", {}).get("prefill", {}).get("answering"):
            said.append("the prefill's bootstrap thread is not reported")
        return said

    def headline(self) -> str:
        decode = f" (decode {self['decode_sglang']})" if self.get("decode_sglang") else ""
        kind = "real sglang" if self.get("engine") == "sglang" else "twin sglang"
        name = f"{kind} {self.get('sglang')}{decode}{' (patched)' if self.get('patched') else ''}"
        if self.healthy:
            return f"{name}: healthy"
        return f"{name}: UNHEALTHY: {'; '.join(self.problems()) or 'not every role answers'}"

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self))

    @staticmethod
    def _thread_word(entry: dict, role: str) -> str:
        if role != "prefill":
            return ""
        value = entry.get("bootstrap_thread_alive")
        return {True: "alive", False: "DEAD"}.get(value, "unknown")

    @staticmethod
    def _queues_text(entry: dict) -> str:
        return ", ".join(f"{k.replace('_queue', '')} {v}" for k, v in (entry.get("queues") or {}).items())

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, padding=(0, 1), header_style="bold")
        for column in ("role", "pid", "alive", "answering", "bootstrap thread", "queues", "url"):
            table.add_column(column, no_wrap=column in ("role", "pid", "url"))
        for role, entry in self.get("roles", {}).items():
            thread = self._thread_word(entry, role)
            table.add_row(role, str(entry.get("pid")),
                          Text(str(entry.get("alive")), style="" if entry.get("alive") else "bold red"),
                          Text(str(entry.get("answering")), style="" if entry.get("answering") else "bold red"),
                          Text(thread, style="bold red" if thread == "DEAD" else "green" if thread == "alive" else ""),
                          self._queues_text(entry), str(entry.get("url") or ""))
        head = Text(self.headline(), style="bold green" if self.healthy else "bold red")
        return Group(head, table, Text(f"inventory: {self.get('inventory')}", style="dim"))

    def _repr_html_(self) -> str:
        left = "text-align:left;vertical-align:top;padding:1px 8px;white-space:nowrap"
        colour = "#188038" if self.healthy else "#d93025"
        rows = []
        for role, entry in self.get("roles", {}).items():
            thread = self._thread_word(entry, role)
            bad = "color:#d93025;font-weight:bold"
            cells = [
                html.escape(role), html.escape(str(entry.get("pid"))),
                f"<span style='{'' if entry.get('alive') else bad}'>{entry.get('alive')}</span>",
                f"<span style='{'' if entry.get('answering') else bad}'>{entry.get('answering')}</span>",
                f"<span style='{bad if thread == 'DEAD' else 'color:#188038' if thread == 'alive' else ''}'>"
                f"{html.escape(thread)}</span>",
                html.escape(self._queues_text(entry)),
                f"<code>{html.escape(str(entry.get('url') or ''))}</code>",
            ]
            rows.append("<tr>" + "".join(f"<td style='{left}'>{c}</td>" for c in cells) + "</tr>")
        head = "".join(f"<th style='{left}'>{c}</th>" for c in
                       ("role", "pid", "alive", "answering", "bootstrap thread", "queues", "url"))
        return (f"<div class='pd-twin-status' style='text-align:left'><b style='color:{colour}'>"
                f"{html.escape(self.headline())}</b><table style='border-collapse:collapse'><tr>{head}</tr>"
                f"{''.join(rows)}</table><small>inventory: <code>{html.escape(str(self.get('inventory')))}</code>"
                "</small></div>")


@dataclass
class Deployment:
    """A running twin: its inventory file, URLs and processes."""

    inventory_path: Path
    timings: dict | None = None

    @property
    def inventory(self) -> inventory_mod.Inventory:
        return inventory_mod.load(self.inventory_path)

    @property
    def settings(self) -> TwinSettings:
        return TwinSettings.from_dict(self.inventory.twin)

    @property
    def directory(self) -> Path:
        return Path(self.settings.directory)

    @property
    def router(self) -> str:
        return self.inventory.engine("router").url

    @property
    def pair(self) -> dict | None:
        """A mixed-version twin's frame check (``forensics.twin.pair``), None for a one-release twin."""
        path = self.directory / PAIR_CHECK_NAME
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    @property
    def prefill(self) -> str:
        return self.inventory.engine("prefill").url

    @property
    def decode(self) -> str:
        return self.inventory.engine("decode").url

    @property
    def bootstrap(self) -> str:
        return self.inventory.engine("prefill").bootstrap_url

    def pid(self, role: str) -> int | None:
        """The role's front: the process listening on its URL, whose children the scheduler and the
        detokenizer are (``twin down`` and ``restart`` signal it), as the real engine's ``pid``."""
        return processes.read_pid(processes.pid_file(self.directory, role))

    def scheduler_pid(self, role: str) -> int | None:
        """The prefill's or the decode's scheduler (where ``bootstrap_thread`` runs: py-spy's target),
        as the real engine's ``scheduler_pid``; None for the router or while none is recorded."""
        if role == "router":
            return None
        return processes.read_pid(processes.scheduler_pid_file(self.directory, role))

    def log_path(self, role: str) -> Path:
        return processes.log_file(self.directory, role)

    def log_text(self, role: str) -> str:
        return self.log_path(role).read_text(errors="replace")

    def nixl_conn(self) -> Path:
        """The twin's own copy of ``nixl/conn.py`` (the file a patch deploy changes)."""
        return Path(self.settings.sglang_root) / "sglang/srt/disaggregation/nixl/conn.py"

    def urls(self) -> dict:
        return {"router": self.router, "prefill": self.prefill, "decode": self.decode,
                "bootstrap": self.bootstrap, "inventory": str(self.inventory_path)}

    def server_info(self, role: str, timeout: float = 5.0) -> dict:
        """The engine's ``/server_info``, or ``/get_server_info`` where the release has only that (< 0.5.6)."""
        base = self.inventory.engine(role).url
        try:
            with urllib.request.urlopen(base + "/server_info", timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        with urllib.request.urlopen(base + "/get_server_info", timeout=timeout) as response:
            return json.load(response)

    def status(self) -> TwinStatus:
        """Per role: pid, alive, answering, URL, queue gauges; for the prefill, whether sglang's
        bootstrap thread lives. A dict (``status()["roles"]["prefill"]["pid"]``) that renders
        itself in JupyterLab and rich; ``.healthy`` says whether all is well."""
        result = TwinStatus(inventory=str(self.inventory_path), sglang=self.settings.sglang,
                            patched=self.settings.patched, roles={})
        if self.settings.decode_sglang:
            result["decode_sglang"] = self.settings.decode_sglang
            result["pair"] = self.pair
        for role in processes.ROLE_ORDER:
            pid = self.pid(role)
            entry = {"pid": pid, "alive": processes.ours(self.directory, role) is not None,
                     "url": self.inventory.engine(role).url}
            try:
                if role == "router":  # mini_lb's /get_server_info asks every server: /health is its own answer
                    with urllib.request.urlopen(entry["url"] + "/health", timeout=2.0):
                        entry["answering"] = True
                    result["roles"][role] = entry
                    continue
                info = self.server_info(role, timeout=2.0)
                entry["answering"] = True
                twin = (info.get("internal_states") or [{}])[0].get("twin", {})
                if role == "prefill":
                    entry["bootstrap_thread_alive"] = twin.get("bootstrap_thread_alive")
                    entry["counters"] = twin.get("counters")
                elif role == "decode":
                    entry["counters"] = twin.get("counters")
                queues = {name: twin[name] for name in QUEUE_GAUGES.get(role, ()) if name in twin}
                if queues:
                    entry["queues"] = queues
            except (OSError, ValueError):
                entry["answering"] = False
            result["roles"][role] = entry
        return result

    def restart(self, role: str = "all") -> float:
        """Stop and start ``role`` (or all three); returns seconds until ready again."""
        roles = processes.ROLE_ORDER if role == "all" else (role,)
        for name in roles:
            if name not in processes.ROLE_ORDER:
                raise TwinError(f"unknown role {name!r} (prefill, decode, router or all)")
        started = time.monotonic()
        processes.stop_all(self.directory, reversed(roles), ports=self.role_ports())
        for name in roles:
            _start_role(self, name)
        return time.monotonic() - started

    def role_ports(self) -> dict[str, tuple[int, ...]]:
        """Each role's listening ports (the prefill's HTTP and bootstrap ports)."""
        settings = self.settings
        return {"prefill": (settings.prefill_port, settings.bootstrap_port), "decode": (settings.decode_port,),
                "router": (settings.router_port,)}

    def down(self) -> list[str]:
        """Stop every process of the twin; returns the roles that were running (see :meth:`take_down`)."""
        return self.take_down()["stopped"]

    def take_down(self) -> dict:
        """Stop every process the twin started and, if the twin created its directory, remove it.

        A pid file naming a process the twin did not start (a reused pid, an older twin's
        file) is *stale*. The role's real process is then looked for by what proves it ours
        (its log file, title and port: :func:`processes.deployment_process`) and stopped
        (``recovered``, also in ``stopped``); if none is found and nothing listens on the role's
        ports, the record is removed without a signal (``stale``); if something unprovable still
        listens there, nothing is signalled, the record is kept and the role is in
        ``still_running`` with its ``listening`` ports. ``removed_directory`` is None if kept.
        """
        settings = self.settings
        directory = Path(settings.directory)
        ports = self.role_ports()
        report: dict = {"stopped": [], "recovered": [], "stale": [], "still_running": [], "listening": {},
                        "removed_directory": None}
        for role, outcome in processes.stop_all(directory, reversed(processes.ROLE_ORDER), ports=ports).items():
            if outcome in ("running", "recovered"):
                report["stopped"].append(role)
            if outcome in ("stale", "recovered"):
                report[outcome].append(role)
            if outcome == "listening":
                report["listening"][role] = processes.listened(ports[role])
        report["still_running"] = processes.running_roles(directory) + [
            role for role in processes.ROLE_ORDER if role in report["listening"]]
        if settings.created_directory and not report["still_running"] and directory.is_dir():
            shutil.rmtree(directory, ignore_errors=True)
            report["removed_directory"] = str(directory)
        return report

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def __rich__(self):
        from rich.table import Table

        table = Table(title=f"twin sglang {self.settings.sglang}{' (patched)' if self.settings.patched else ''}")
        for column in ("role", "url", "pid", "alive"):
            table.add_column(column)
        for role in processes.ROLE_ORDER:
            alive = processes.ours(self.directory, role) is not None
            table.add_row(role, self.inventory.engine(role).url, str(self.pid(role)), str(alive))
        return table

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{role}</td><td>{html.escape(self.inventory.engine(role).url)}</td>"
            f"<td>{self.pid(role)}</td><td>{processes.ours(self.directory, role) is not None}</td></tr>"
            for role in processes.ROLE_ORDER
        )
        return (f"<b>twin sglang {html.escape(self.settings.sglang)}</b> ({html.escape(str(self.inventory_path))})"
                f"<table><tr><th>role</th><th>url</th><th>pid</th><th>alive</th></tr>{rows}</table>")


def _start_role(deployment: Deployment, role: str) -> float:
    settings = deployment.settings
    wanted = {"prefill": {"prefill": settings.prefill_port, "bootstrap": settings.bootstrap_port},
              "decode": {"decode": settings.decode_port}, "router": {"router": settings.router_port}}[role]
    listeners = _bind(settings.host, wanted, hint=f"cannot restart the twin's {role} on it", retry_s=10.0)
    try:
        child = processes.start(role, deployment.inventory_path, deployment.directory, listeners=listeners)
    finally:
        _close(listeners)
    try:
        seconds = _wait_role(deployment, role, child)
    except BaseException:
        processes.stop(deployment.directory, role)
        child.release_lifeline()
        raise
    child.handover()
    return seconds


def _wait_role(deployment: Deployment, role: str, proc) -> float:
    ready_url = deployment.inventory.engine(role).url + ("/health" if role == "router" else "/ping")
    return processes.wait_ready(role, ready_url, proc, deployment.directory)


def _bind(host: str, wanted: dict[str, int], hint: str, retry_s: float = 0.0) -> dict[int, object]:
    """Listening sockets for ``wanted`` (name -> port, 0 for any), keyed by the port bound.

    ``retry_s``: keep trying a taken port that long (a restarted role's old process may still
    be releasing it).
    """
    listeners: dict[int, object] = {}
    try:
        for name, port in wanted.items():
            deadline = time.monotonic() + retry_s
            while True:
                try:
                    sock = processes.bind_listener(host, port)
                    break
                except OSError as exc:
                    if port and time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    raise TwinError(f"port {port} ({name}) on {host} is already in use ({exc.strerror}); "
                                    f"{hint}") from None
            listeners[sock.getsockname()[1]] = sock
    except BaseException:
        _close(listeners)
        raise
    return listeners


def _close(listeners: dict) -> None:
    for sock in listeners.values():
        sock.close()


def check_waiting_timeout(value) -> float:
    """The decode waiting timeout, seconds: a positive finite number (else a usage error)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise UsageProblem(f"--waiting-timeout: expected a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageProblem(f"--waiting-timeout: expected a positive number of seconds, got {value!r}")
    return seconds


def check_release_served(source) -> None:
    """Refuse (exit 4, naming what is missing) a release whose requests the twin cannot serve.

    Decided from the release's code (:func:`forensics.twin.release_check.missing_for_twin`): the
    failure type, the KVArgs fields, the receiver methods the twin's decode calls, and how its
    decode learns a transfer ended. A twin that started anyway would answer /ping while every
    request failed or waited out its timeout; this says why before anything starts.
    """
    from forensics.twin.release_check import missing_for_twin

    missing = missing_for_twin(source)
    if missing:
        raise TwinError(f"sglang {source.version}: the twin cannot serve this release (its NIXL code needs what the "
                        f"twin does not provide): {'; '.join(missing)}")


@contextlib.contextmanager
def _directory_lock(directory: Path):
    """Hold an exclusive lock on the twin directory while ``up`` works in it (flock on the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TwinError(f"{directory}: another 'twin up' is starting a twin in this directory") from None
        yield
    finally:
        os.close(fd)


def _refuse_if_running(directory: Path) -> None:
    running = processes.running_roles(directory)
    if not running:
        return
    inventory_path = directory / INVENTORY_NAME
    pids = ", ".join(f"{role} {processes.read_pid(processes.pid_file(directory, role))}" for role in running)
    described = f"pids {pids}"
    try:
        inv = inventory_mod.load(inventory_path)
        router = next((e.url for e in inv.engines if e.role == "router"), None)
        described = f"sglang {inv.sglang}, router {router}, {described}"
    except EnvironmentProblem:
        pass
    raise TwinError(f"a twin is already running in {directory} ({described}); take it down first: "
                    f"forensics twin down --inventory {inventory_path}")


def copy_release(source_root: Path, destination: Path) -> Path:
    """Lay out the release like site-packages, sharing no writable inode with the cache.

    What a twin or a patch deploy may change is copied and left writable: everything under
    ``disaggregation/`` and every Python file, read through
    :func:`~forensics.sglang_source.verified_read_bytes` (checked against the sha256 recorded
    when the release was unpacked). Other files (JSON configs, .so, ...), which the twin never
    imports, are hard-linked only when the cache's file is read-only, else copied. (root can
    still write a read-only file; the cache's size/mtime check on every reuse catches that.)
    Bytecode caches are not the release: ``__pycache__`` is left out (a Python that writes
    bytecode fills the cache's with files that the cache's own check removes, which raced this
    copy; and a copied ``.pyc`` could outlive a later patch of its source).
    """
    import stat

    from forensics.sglang_source import verified_read_bytes

    target = destination / "sglang"
    if target.exists():
        shutil.rmtree(target)
    write_bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH

    def copy_or_link(src: str, dst: str) -> None:
        mode = stat.S_IMODE(os.stat(src).st_mode)
        if "/disaggregation/" in src or src.endswith(".py"):
            data = verified_read_bytes(src)
            with open(dst, "wb") as out:
                out.write(data)
            shutil.copystat(src, dst)
            os.chmod(dst, mode | stat.S_IWUSR)
            return
        if not mode & write_bits:
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)
        os.chmod(dst, mode | stat.S_IWUSR)

    shutil.copytree(source_root / "sglang", target, copy_function=copy_or_link,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def up(
    sglang: str = "0.5.15",
    *,
    patched: bool = False,
    backend: str = "nixl",
    base_port: int | None = None,
    waiting_timeout: float = DEFAULT_WAITING_TIMEOUT_S,
    directory: str | Path | None = None,
    decode_sglang: str | None = None,
    **overrides,
) -> Deployment:
    """Start a twin (prefill, decode, router on 127.0.0.1) and return it once all three answer.

    Raises :class:`TwinError` (nothing left running) for a busy port, a release that cannot
    be fetched, or a backend the release or the twin lacks.

    ``decode_sglang``: the decode runs another release, as during a rolling upgrade. Before
    anything starts, the engine sandbox replays the decode release's frames into the prefill
    release's loop (:func:`forensics.twin.pair.check_pair`): a frame every request needs that the
    loop cannot take is refused, naming the frame; a loop that dies on the decode's ABORT is the
    pair's expected fate (``Deployment.pair``), not a refusal. In the other direction, a decode that
    completes transfers only on a signal the prefill release never sends (0.5.23's ``KV_STATUS``
    behind a 0.5.22 prefill) is refused, naming both source lines. ``patched`` patches the prefill.

    Example: ``twin = fx.twin.up("0.5.15", waiting_timeout=15); twin.status()``
    """
    from forensics.sglang_source import fetch

    started = time.monotonic()
    waiting_timeout = check_waiting_timeout(waiting_timeout)
    host = overrides.pop("host", "127.0.0.1")
    if base_port is not None:
        for name, port in zip(PORT_NAMES, [base_port + i for i in range(4)], strict=True):
            if not 0 < port < 65536:
                raise TwinError(f"--base-port {base_port}: port {port} ({name}) is not a TCP port")
    created = directory is None
    if created:
        directory = Path(tempfile.mkdtemp(prefix=f"twin-{sglang}-"))
    else:
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TwinError(f"{directory}: cannot create the twin directory ({exc.strerror})") from None
    try:
        with _directory_lock(directory):
            _refuse_if_running(directory)
            return _up_in(directory, created, sglang, patched=patched, backend=backend, base_port=base_port,
                          host=host, waiting_timeout=waiting_timeout, started=started, fetch=fetch,
                          decode_sglang=decode_sglang if decode_sglang != sglang else None, **overrides)
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise


def _up_in(directory: Path, created: bool, sglang: str, *, patched: bool, backend: str, base_port: int | None,
           host: str, waiting_timeout: float, started: float, fetch, decode_sglang: str | None = None,
           **overrides) -> Deployment:
    # The launcher binds every listening socket and hands it to its process: no window in which
    # another twin can take a port between "it is free" and "the child binds it".
    wanted = {name: (base_port + i if base_port is not None else 0) for i, name in enumerate(PORT_NAMES)}
    listeners = _bind(host, wanted, hint="choose another --base-port")
    try:
        ports = list(listeners)
        source = fetch(sglang)  # raises SourceError (an EnvironmentProblem) naming the release
        if backend not in source.backends():
            raise TwinError(f"sglang {sglang} has no {backend} backend (has: {', '.join(source.backends())})")
        if backend not in SUPPORTED_BACKENDS:
            raise TwinError(f"the twin runs the {' and '.join(SUPPORTED_BACKENDS)} backends (got --backend {backend})")
        # --- backend dispatch: what each backend's twin can serve, decided up front (exit 4) ---
        if backend == "mooncake":
            from forensics.twin.release_mooncake import check_mooncake_served

            if patched:
                raise TwinError("--patched applies the NIXL fix to nixl/conn.py, which a Mooncake twin does not run "
                                "(Mooncake's loop has its own ABORT case from 0.5.13)")
            check_mooncake_served(source)
        else:
            check_release_served(source)
        # --- end backend dispatch ---
        if decode_sglang and backend != "nixl":
            raise TwinError("a mixed-version twin runs the NIXL backend only (its pair check replays NIXL frames)")
        mixed = _decode_release(source, decode_sglang, backend, fetch, directory) if decode_sglang else {}
        site = copy_release(source.root, directory / "site-packages")
        if patched:
            _apply_patch(site, sglang)
        settings = TwinSettings(
            directory=str(directory.resolve()), sglang=sglang, sglang_root=str(site.resolve()), backend=backend, **mixed,
            patched=patched, host=host, router_port=ports[0], prefill_port=ports[1], bootstrap_port=ports[2],
            decode_port=ports[3], waiting_timeout_s=waiting_timeout, created_directory=created, **overrides,
        )
        inventory_path = directory / INVENTORY_NAME
        inventory_mod.dump(build_inventory(settings, inventory_path), inventory_path)
        deployment = Deployment(inventory_path)
        timings = {}
        children: dict[str, processes.Child] = {}
        role_ports = {"prefill": (ports[1], ports[2]), "decode": (ports[3],), "router": (ports[0],)}
        try:
            # All three start at once (each waits for nothing but its own port); then readiness.
            for role in processes.ROLE_ORDER:
                mine = {port: listeners[port] for port in role_ports[role]}
                children[role] = processes.start(role, inventory_path, directory, listeners=mine)
                _close(mine)  # the child has its own copy now
                if role == "prefill":
                    processes.fault("after-prefill-started")
            processes.fault("after-all-started")
            for role, child in children.items():
                timings[role] = round(_wait_role(deployment, role, child), 3)
                if role == "prefill":
                    processes.fault("after-prefill-ready")
            processes.fault("before-handover")
        except BaseException:
            processes.stop_all(Path(deployment.settings.directory), reversed(processes.ROLE_ORDER))
            for child in children.values():
                child.release_lifeline()
            raise
        # Handed over: from here the twin outlives whoever started it (later 'twin down' attaches).
        for child in children.values():
            child.handover()
    finally:
        _close(listeners)
    timings["total"] = round(time.monotonic() - started, 3)
    deployment.timings = timings
    return deployment


def _decode_release(prefill_source, version: str, backend: str, fetch, directory: Path) -> dict:
    """Fetch, check and copy the decode's own release for a mixed pair; the TwinSettings fields."""
    from forensics.sandbox.errors import SandboxError
    from forensics.twin.pair import check_pair

    decode_source = fetch(version)
    check_release_served(decode_source)
    if backend not in decode_source.backends():
        raise TwinError(f"sglang {version} (the decode) has no {backend} backend")
    try:
        pair = check_pair(prefill_source, decode_source)
    except SandboxError as exc:
        raise TwinError(f"prefill {prefill_source.version} / decode {version}: the frame check could not run in "
                        f"the engine sandbox, so the pair is not started: {exc}") from None
    if not pair.servable:
        raise TwinError(f"prefill {prefill_source.version} / decode {version} cannot serve: {pair.refused}")
    site = copy_release(decode_source.root, directory / "site-packages-decode")
    (directory / PAIR_CHECK_NAME).write_text(json.dumps(pair.to_dict(), indent=2) + "\n", encoding="utf-8")
    return {"decode_sglang": version, "decode_sglang_root": str(site.resolve())}


def _apply_patch(site: Path, version: str) -> None:
    """Patch the twin's copy of ``nixl/conn.py`` with the project's codemod, as a deploy would
    (backup kept beside the twin, atomic compile-checked write)."""
    try:
        from patched_engine.apply import apply_file
    except ImportError as exc:
        raise TwinError(f"--patched needs the patched_engine codemod, which is not importable: {exc}") from exc
    conn = site / "sglang/srt/disaggregation/nixl/conn.py"
    apply_file(conn, yes=True, backup_dir=site.parent / "backups", release=version)


def build_inventory(settings: TwinSettings, inventory_path: Path) -> inventory_mod.Inventory:
    import shlex
    import sys

    directory = Path(settings.directory)

    def restart(role: str) -> str:
        # A shell command line, as a live inventory's systemctl line is: every path quoted.
        return shlex.join([sys.executable, "-m", "forensics", "twin", "restart", role,
                           "--inventory", str(inventory_path)])

    engines = []
    for role, port in (("prefill", settings.prefill_port), ("decode", settings.decode_port),
                       ("router", settings.router_port)):
        release, root = settings.release_of(role)
        engines.append(inventory_mod.Engine(
            role=role, host=inventory_mod.Host("local"), url=settings.url(port), python=sys.executable,
            sglang_location=root, sglang=release if release != settings.sglang else None,
            bootstrap_port=settings.bootstrap_port if role == "prefill" else None,
            log_file=str(processes.log_file(directory, role)),
            stderr_file=str(processes.log_file(directory, role)),
            process="sglang::router" if role == "router" else "sglang::scheduler",
            pid_file=str(processes.pid_file(directory, role) if role == "router"
                         else processes.scheduler_pid_file(directory, role)),
            restart=restart(role),
        ))
    return inventory_mod.Inventory(
        name=f"twin-{settings.sglang}-{settings.backend}{'-patched' if settings.patched else ''}",
        engines=tuple(engines), sglang=settings.sglang, backend=settings.backend, twin=settings.to_dict(),
    )


def attach(inventory_path: str | Path) -> Deployment:
    """The twin described by an inventory file written by :func:`up`.

    Example: ``fx.twin.attach("pd-twin/inventory.toml").status()``
    """
    inv = inventory_mod.load(inventory_path)
    if not inv.is_twin:
        raise TwinError(f"{inventory_path}: not a twin's inventory (no [twin] table)")
    return Deployment(Path(inventory_path))
