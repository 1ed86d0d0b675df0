"""The real sglang engine as a deployment behind an inventory: ``twin up --engine sglang``.

    deployment = forensics.engine.deployment.up("0.5.15", directory="pd-real")
    deployment.status(); deployment.restart("decode"); deployment.take_down()

Real ``sglang.launch_server`` prefill and decode (KV over NIXL/UCX on loopback) and sglang-router's
mini load balancer, on 127.0.0.1, each under a lifeline (:mod:`forensics.engine.lifeline`) until
all three answer ``/health``. The deployment directory holds the inventory (the twin's format,
``[twin] engine = "sglang"``), each role's process records (:mod:`forensics.engine.records`) and
one log per role; no sglang source. The engine runs from the deployment's own hard-link clone of
the release's cached environment (:mod:`forensics.engine.clone`); ``patched`` applies the fix's
codemod to the clone's ``nixl/conn.py`` before anything starts. Collectors, diagnose and watch see
only the inventory.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from forensics.engine import clone, launch, records, roles
from forensics.exitcodes import EnvironmentProblem, UsageProblem
from forensics.inventory import Engine, Host, Inventory, dump, load
from forensics.inventory.twin_table import DEFAULT_WAITING_TIMEOUT_S, TwinSettings

INVENTORY_NAME = "inventory.toml"
PORT_NAMES = ("router", "prefill", "bootstrap", "decode")
STOP_TIMEOUT_S = 15.0  # then SIGKILL: a wedged prefill never finishes its SIGTERM
HOST = launch.HOST


class DeploymentError(EnvironmentProblem):
    """The deployment cannot be set up as asked (a port in use, a directory in use, ...)."""


def refuse_unsupported(*, backend: str = "nixl", decode_sglang: str | None = None, sglang: str = "") -> None:
    """What the real engine does not run yet: a usage error (exit 2) naming the flag.

    The one place these refusals live (a mixed pair and Mooncake may come later)."""
    if decode_sglang and decode_sglang != sglang:
        raise UsageProblem("--decode-sglang: the real engine runs one release for prefill and decode "
                           "(a mixed pair runs on the twin: --engine twin)")
    if backend != "nixl":
        raise UsageProblem(f"--backend {backend}: the real engine runs the NIXL backend only (the Mooncake "
                           "backend runs on the twin: --engine twin)")


def check_waiting_timeout(value) -> int:
    """sglang reads SGLANG_DISAGGREGATION_WAITING_TIMEOUT as a whole number of seconds (EnvInt)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise UsageProblem(f"--waiting-timeout: expected a number of seconds, got {value!r}") from None
    if not seconds.is_integer() or seconds < 1:
        raise UsageProblem(f"--waiting-timeout {value}: real sglang reads SGLANG_DISAGGREGATION_WAITING_TIMEOUT "
                           "as a whole number of seconds (at least 1)")
    return int(seconds)


def _ports(base_port: int | None) -> dict[str, int]:
    if base_port is None:
        return dict(zip(PORT_NAMES, launch.free_server_ports(len(PORT_NAMES)), strict=True))
    ports = {name: base_port + i for i, name in enumerate(PORT_NAMES)}
    for name, port in ports.items():
        if not 0 < port < 65536:
            raise UsageProblem(f"--base-port {base_port}: port {port} ({name}) is not a TCP port")
        if name in ("prefill", "decode") and port > launch.MAX_SERVER_PORT:
            raise UsageProblem(f"--base-port {base_port}: the {name}'s port {port} is above {launch.MAX_SERVER_PORT} "
                               "(real sglang derives a gRPC port as port + 10000 and refuses one past 65535)")
    return ports


def _refuse_ports_in_use(ports: dict[str, int]) -> None:
    import socket

    for name, port in ports.items():
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((HOST, port))
            except OSError as exc:
                raise DeploymentError(f"port {port} ({name}) on {HOST} is already in use ({exc.strerror}); "
                                      "choose another --base-port") from None


@dataclass
class EngineDeployment:
    """A running real-engine deployment: its inventory, URLs and processes."""

    inventory_path: Path
    timings: dict | None = None

    @property
    def inventory(self) -> Inventory:
        return load(self.inventory_path)

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
    def prefill(self) -> str:
        return self.inventory.engine("prefill").url

    @property
    def decode(self) -> str:
        return self.inventory.engine("decode").url

    @property
    def bootstrap(self) -> str:
        return self.inventory.engine("prefill").bootstrap_url

    pair = None  # one release for both servers

    def urls(self) -> dict:
        return {"router": self.router, "prefill": self.prefill, "decode": self.decode,
                "bootstrap": self.bootstrap, "inventory": str(self.inventory_path)}

    def pid(self, role: str) -> int | None:
        record = records.read_record(self.directory, role)
        return None if record is None else record["pid"]

    def scheduler_pid(self, role: str) -> int | None:
        proc = records.scheduler(self.directory, role)
        return None if proc is None else proc.pid

    def log_path(self, role: str) -> Path:
        return records.log_file(self.directory, role)

    def log_text(self, role: str) -> str:
        return self.log_path(role).read_text(errors="replace")

    def status(self):
        from forensics.engine.deployment_status import status

        return status(self)

    def restart(self, role: str | tuple[str, ...] = "all", *, stop_timeout: float = STOP_TIMEOUT_S) -> float:
        """Stop and start ``role`` (several at once: a tuple; or all three) on the same ports; seconds until
        ready again. ``("prefill", "decode")`` restarts a wedged 0.5.15 pair in one start-up, not two.

        Raises :class:`~forensics.engine.launch.EngineStartError` (exit 4) when a role does not come
        back; what was started then is stopped."""
        names = roles.ROLE_ORDER if role == "all" else ((role,) if isinstance(role, str) else tuple(role))
        for name in names:
            if name not in roles.ROLE_ORDER:
                raise UsageProblem(f"unknown role {name!r} (prefill, decode, router or all)")
        settings = self.settings
        started_at = time.monotonic()
        records.stop(self.directory, tuple(reversed(names)), stop_timeout)
        ports = _role_ports(settings)
        _wait_ports_free({p: ports[p] for n in names for p in _PORTS_OF[n]}, timeout=30.0)
        _start_and_hand_over(settings, names, faults=True)
        return time.monotonic() - started_at

    def down(self) -> list[str]:
        return self.take_down()["stopped"]

    def take_down(self, *, stop_timeout: float = STOP_TIMEOUT_S) -> dict:
        """Stop every process of the deployment (SIGTERM, then SIGKILL after ``stop_timeout`` s), remove
        its clone in the cache and, if ``up`` created the directory, the directory.

        The report has the twin's keys (``stopped``, ``recovered``, ``stale``, ``still_running``,
        ``listening``, ``removed_directory``) and ``killed`` (the roles that needed SIGKILL),
        ``removed_environment`` (the clone), ``environment_in_use`` (pids still running from the
        clone that no record proves ours: nothing signalled, the clone and directory kept) and
        ``seconds``."""
        started = time.monotonic()
        settings = self.settings
        directory = Path(settings.directory)
        outcomes = records.stop(directory, tuple(reversed(roles.ROLE_ORDER)), stop_timeout)
        report: dict = {"stopped": [], "killed": [], "recovered": [], "stale": [], "still_running": [],
                        "listening": {}, "removed_directory": None, "removed_environment": None}
        for role in roles.ROLE_ORDER:
            outcome = outcomes.get(role)
            if outcome in ("terminated", "killed"):
                report["stopped"].append(role)
            if outcome == "killed":
                report["killed"].append(role)
            if outcome == "stale":
                report["stale"].append(role)
            if outcome == "left" or records.running(directory, role):
                report["still_running"].append(role)
        in_use = clone.users(directory)
        if in_use:  # processes no record proves ours still run from the clone: it stays, named
            report["environment_in_use"] = in_use
        if not report["still_running"] and not in_use:
            removed = clone.remove(directory)
            report["removed_environment"] = None if removed is None else str(removed)
            if settings.created_directory and directory.is_dir():
                shutil.rmtree(directory, ignore_errors=True)
                report["removed_directory"] = str(directory)
        report["seconds"] = round(time.monotonic() - started, 3)
        return report

    def __enter__(self) -> EngineDeployment:
        return self

    def __exit__(self, *exc) -> None:
        self.take_down()

    def __rich__(self):
        from rich.table import Table

        settings = self.settings
        table = Table(title=f"real sglang {settings.sglang}{' (patched)' if settings.patched else ''}, "
                            f"model {settings.model_size}")
        for column in ("role", "url", "pid", "alive"):
            table.add_column(column)
        for role in roles.ROLE_ORDER:
            table.add_row(role, self.inventory.engine(role).url, str(self.pid(role)),
                          str(records.running(self.directory, role)))
        return table


_PORTS_OF = {"prefill": ("prefill", "bootstrap"), "decode": ("decode",), "router": ("router",)}


def _role_ports(settings: TwinSettings) -> dict[str, int]:
    return {"router": settings.router_port, "prefill": settings.prefill_port,
            "bootstrap": settings.bootstrap_port, "decode": settings.decode_port}


def _wait_ports_free(ports: dict[str, int], timeout: float) -> None:
    """A stopped role's sockets may take a moment to go; a port held longer is somebody else's."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _refuse_ports_in_use(ports)
            return
        except DeploymentError as exc:
            if time.monotonic() > deadline:
                raise DeploymentError(f"cannot restart on the same ports: {exc}") from None
            time.sleep(0.2)


def _start_and_hand_over(settings: TwinSettings, names, ready_timeouts: dict[str, float] | None = None,
                         faults: bool = False) -> dict[str, float]:
    """Start ``names`` at once under lifelines, wait until each answers, hand them over.

    Any failure (a role that exits, a missed deadline, an interrupt) stops every process started
    here before the exception leaves: the lifelines are dropped (each shim kills its engine's group)
    and the records are used to stop whatever is left."""
    from forensics.twin.processes import fault

    directory = Path(settings.directory)
    held: dict[str, roles.HeldProcess] = {}
    started: dict[str, float] = {}
    try:
        for role in names:
            started[role] = time.monotonic()
            held[role] = roles.start_role(settings, role)
            if faults and role == "prefill":
                fault("after-prefill-started")
        if faults:
            fault("after-all-started")

        def ready(role: str) -> None:
            records.remember_members(directory, role)
            if faults and role == "prefill":
                fault("after-prefill-ready")

        timings = roles.wait_ready(settings, held, started, ready_timeouts, on_ready=ready)
        for role in names:  # the members again: a child started after its role first answered
            records.remember_members(directory, role)
        if faults:
            fault("before-handover")
    except BaseException:
        for process in held.values():
            process.abandon()
        records.stop(directory, tuple(reversed(list(held))), 5.0)
        raise
    for process in held.values():
        process.handover()
    return timings


def up(sglang: str = "0.5.15", *, patched: bool = False, backend: str = "nixl", base_port: int | None = None,
       waiting_timeout: float = DEFAULT_WAITING_TIMEOUT_S, directory: str | Path | None = None,
       decode_sglang: str | None = None, model_size: str = "tiny", progress=None,
       ready_timeouts: dict[str, float] | None = None) -> EngineDeployment:
    """Start real sglang (prefill, decode, mini LB) on 127.0.0.1 and return it once all three answer.

    Refused before anything starts: a release with no engine environment here (exit 2), a flag the
    real engine does not run yet (exit 2), a port in use (exit 4). A failure during start-up (an
    engine that exits, a deadline missed, ``ready_timeouts`` role -> s) leaves nothing running.
    """
    from forensics.engine import environment, model, pins

    started = time.monotonic()
    refuse_unsupported(backend=backend, decode_sglang=decode_sglang, sglang=sglang)
    pins.check_release(sglang)
    waiting = check_waiting_timeout(waiting_timeout)
    model._shape(model_size)  # an unknown size is a usage error before anything is built
    ports = _ports(base_port)
    created = directory is None
    if created:
        directory = Path(tempfile.mkdtemp(prefix=f"engine-{sglang}-"))
    else:
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DeploymentError(f"{directory}: cannot create the deployment directory ({exc.strerror})",
                                  path=str(directory)) from None
    inventory_path = directory / INVENTORY_NAME
    cloned_here = False
    try:
        with _directory_lock(directory):
            _refuse_if_running(directory)
            _refuse_ports_in_use(ports)
            timings: dict[str, float] = {}
            mark = time.monotonic()
            env = environment.prepare(sglang, progress=progress)
            served = model.build(model_size, env.python)
            timings["environment"] = round(time.monotonic() - mark, 3)
            mark = time.monotonic()
            cloned_here = True
            cloned = clone.clone_environment(env.root, directory)
            site = environment._site_packages(cloned)
            if patched:
                _apply_fix(site, sglang, clone.deployment_cache(directory) / "backups")
            timings["clone"] = round(time.monotonic() - mark, 3)
            settings = TwinSettings(
                directory=str(directory.resolve()), sglang=sglang, sglang_root=str(site), backend=backend,
                patched=patched, host=HOST, router_port=ports["router"], prefill_port=ports["prefill"],
                bootstrap_port=ports["bootstrap"], decode_port=ports["decode"], waiting_timeout_s=float(waiting),
                created_directory=created, engine="sglang", engine_env=str(cloned), model=str(served.path),
                model_size=model_size)
            dump(build_inventory(settings, inventory_path), inventory_path)
            timings.update(_start_and_hand_over(settings, roles.ROLE_ORDER, ready_timeouts, faults=True))
    except BaseException:
        if cloned_here:  # nothing of it runs now (_start_and_hand_over stopped what it started)
            clone.remove(directory)
            inventory_path.unlink(missing_ok=True)  # no deployment: the logs stay, for the reason
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    timings["total"] = round(time.monotonic() - started, 3)
    return EngineDeployment(inventory_path, timings)


def _apply_fix(site: Path, version: str, backups: Path) -> None:
    """The fix's codemod on the clone's ``nixl/conn.py``, on top of the CPU adaptation (atomic write:
    a new inode, so the cached environment's file is untouched)."""
    from patched_engine.apply import apply_file

    backups.mkdir(parents=True, exist_ok=True)
    apply_file(site / "sglang/srt/disaggregation/nixl/conn.py", yes=True, backup_dir=backups, release=version)


@contextlib.contextmanager
def _directory_lock(directory: Path):
    import fcntl
    import os

    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DeploymentError(f"{directory}: another 'twin up' is starting a deployment in this directory",
                                  path=str(directory)) from None
        yield
    finally:
        os.close(fd)


def _refuse_if_running(directory: Path) -> None:
    running = [role for role in roles.ROLE_ORDER if records.running(directory, role)]
    if running:
        raise DeploymentError(f"a deployment is already running in {directory} ({', '.join(running)}); take it "
                              f"down first: forensics twin down --inventory {directory / INVENTORY_NAME}",
                              path=str(directory))


def build_inventory(settings: TwinSettings, inventory_path: Path) -> Inventory:
    """The deployment's inventory: the engines' own URLs, the clone's interpreter and site-packages,
    one log per role, the schedulers' pid files (``bootstrap_thread`` lives in the prefill's)."""
    directory = Path(settings.directory)
    python = str(roles.EngineEnvironmentView(settings.engine_env, settings.sglang).python)

    def restart(role: str) -> str:
        return shlex.join([sys.executable, "-m", "forensics", "twin", "restart", role,
                           "--inventory", str(inventory_path)])

    engines = []
    for role in roles.ROLE_ORDER:
        server = role != "router"
        log = str(records.log_file(directory, role))
        engines.append(Engine(
            role=role, host=Host("local"), url=roles.url_of(settings, role), python=python,
            sglang_location=settings.sglang_root,
            bootstrap_port=settings.bootstrap_port if role == "prefill" else None,
            log_file=log, stderr_file=log,
            process=records.SCHEDULER_TITLE if server else None,
            pid_file=str(records.scheduler_pid_file(directory, role) if server else records.pid_file(directory, role)),
            restart=restart(role)))
    name = f"sglang-{settings.sglang}-{settings.backend}{'-patched' if settings.patched else ''}"
    return Inventory(name=name, engines=tuple(engines), sglang=settings.sglang, backend=settings.backend,
                     twin=settings.to_dict())


def attach(inventory_path: str | Path) -> EngineDeployment:
    inv = load(inventory_path)
    if inv.twin.get("engine") != "sglang":
        raise DeploymentError(f"{inventory_path}: not a real-engine deployment's inventory ([twin] engine is "
                              f"{inv.twin.get('engine', 'twin')!r})", path=str(inventory_path))
    return EngineDeployment(Path(inventory_path))
