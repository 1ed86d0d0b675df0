"""``forensics.twin.up(...)``: start a twin, hand back a :class:`Deployment`, stop it after.

    with fx.twin.up("0.5.15") as twin:
        httpx.post(twin.router + "/v1/completions", json={...})
        twin.restart("prefill")

The twin runs from its own copy of the release's files (``<dir>/site-packages/sglang``;
``disaggregation/`` copied, everything else hard-linked), so patching that copy and
restarting the prefill changes what runs, as a patch deploy on a live host does.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from forensics.exitcodes import EnvironmentProblem
from forensics.twin import inventory as inventory_mod
from forensics.twin import processes
from forensics.twin.settings import DEFAULT_WAITING_TIMEOUT_S, TwinSettings

INVENTORY_NAME = "inventory.toml"
SUPPORTED_BACKENDS = ("nixl",)


class TwinError(EnvironmentProblem):
    """The twin cannot be set up as asked; the message says what and why."""


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
    def prefill(self) -> str:
        return self.inventory.engine("prefill").url

    @property
    def decode(self) -> str:
        return self.inventory.engine("decode").url

    @property
    def bootstrap(self) -> str:
        return self.inventory.engine("prefill").bootstrap_url

    def pid(self, role: str) -> int | None:
        return processes.read_pid(processes.pid_file(self.directory, role))

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
        url = self.inventory.engine(role).url + "/server_info"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)

    def status(self) -> dict:
        """Per role: pid, alive, answering; for the prefill, whether sglang's bootstrap thread lives."""
        result = {"inventory": str(self.inventory_path), "sglang": self.settings.sglang,
                  "patched": self.settings.patched, "roles": {}}
        for role in processes.ROLE_ORDER:
            pid = self.pid(role)
            entry = {"pid": pid, "alive": processes.alive(pid), "url": self.inventory.engine(role).url}
            try:
                info = self.server_info(role, timeout=2.0)
                entry["answering"] = True
                twin = (info.get("internal_states") or [{}])[0].get("twin", {})
                if role == "prefill":
                    entry["bootstrap_thread_alive"] = twin.get("bootstrap_thread_alive")
                    entry["counters"] = twin.get("counters")
                elif role == "decode":
                    entry["counters"] = twin.get("counters")
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
        for name in reversed(roles):
            processes.stop(self.directory, name)
        for name in roles:
            _start_role(self, name)
        return time.monotonic() - started

    def down(self) -> list[str]:
        """Stop every process of the twin; returns the roles that were running."""
        stopped = []
        for role in reversed(processes.ROLE_ORDER):
            if processes.stop(self.directory, role):
                stopped.append(role)
        return stopped

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
            pid = self.pid(role)
            table.add_row(role, self.inventory.engine(role).url, str(pid), str(processes.alive(pid)))
        return table

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{role}</td><td>{html.escape(self.inventory.engine(role).url)}</td>"
            f"<td>{self.pid(role)}</td><td>{processes.alive(self.pid(role))}</td></tr>"
            for role in processes.ROLE_ORDER
        )
        return (f"<b>twin sglang {html.escape(self.settings.sglang)}</b> ({html.escape(str(self.inventory_path))})"
                f"<table><tr><th>role</th><th>url</th><th>pid</th><th>alive</th></tr>{rows}</table>")


def _start_role(deployment: Deployment, role: str) -> float:
    proc = processes.start(role, deployment.inventory_path, deployment.directory)
    return _wait_role(deployment, role, proc)


def _wait_role(deployment: Deployment, role: str, proc) -> float:
    ready_url = deployment.inventory.engine(role).url + ("/health" if role == "router" else "/ping")
    return processes.wait_ready(role, ready_url, proc, deployment.directory)


def copy_release(source_root: Path, destination: Path) -> Path:
    """Lay out the release like site-packages: ``disaggregation/`` copied, the rest hard-linked."""
    target = destination / "sglang"
    if target.exists():
        shutil.rmtree(target)

    def link_or_copy(src: str, dst: str) -> None:
        if "/disaggregation/" in src:
            shutil.copy2(src, dst)
            return
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source_root / "sglang", target, copy_function=link_or_copy)
    return destination


def up(
    sglang: str = "0.5.15",
    *,
    patched: bool = False,
    backend: str = "nixl",
    base_port: int | None = None,
    waiting_timeout: float = DEFAULT_WAITING_TIMEOUT_S,
    directory: str | Path | None = None,
    **overrides,
) -> Deployment:
    """Start a twin (prefill, decode, router on 127.0.0.1) and return it once all three answer.

    Raises :class:`TwinError` (nothing left running) for a busy port, a release that cannot
    be fetched, or a backend the release or the twin lacks.
    """
    from forensics.sglang_source import fetch

    started = time.monotonic()
    host = overrides.pop("host", "127.0.0.1")
    if base_port is not None:
        ports = [base_port + i for i in range(4)]
        for name, port in zip(("router", "prefill", "bootstrap", "decode"), ports, strict=True):
            if not 0 < port < 65536:
                raise TwinError(f"--base-port {base_port}: port {port} ({name}) is not a TCP port")
            if not processes.port_free(host, port):
                raise TwinError(f"port {port} ({name}) on {host} is already in use; choose another --base-port")
    else:
        ports = processes.free_ports(host, 4)
    source = fetch(sglang)  # raises SourceError (an EnvironmentProblem) naming the release
    if backend not in source.backends():
        raise TwinError(f"sglang {sglang} has no {backend} backend (has: {', '.join(source.backends())})")
    if backend not in SUPPORTED_BACKENDS:
        raise TwinError(f"the twin runs the NIXL backend only (got --backend {backend}); "
                        "a mooncake twin is not built yet")
    directory = Path(directory) if directory else Path(tempfile.mkdtemp(prefix=f"twin-{sglang}-"))
    directory.mkdir(parents=True, exist_ok=True)
    site = copy_release(source.root, directory / "site-packages")
    if patched:
        _apply_patch(site, sglang)
    settings = TwinSettings(
        directory=str(directory.resolve()), sglang=sglang, sglang_root=str(site.resolve()), backend=backend,
        patched=patched, host=host, router_port=ports[0], prefill_port=ports[1], bootstrap_port=ports[2],
        decode_port=ports[3], waiting_timeout_s=float(waiting_timeout), **overrides,
    )
    inventory_path = directory / INVENTORY_NAME
    inventory_mod.dump(build_inventory(settings, inventory_path), inventory_path)
    deployment = Deployment(inventory_path)
    timings = {}
    try:
        # All three start at once (each waits for nothing but its own port); then readiness.
        procs = {role: processes.start(role, inventory_path, directory) for role in processes.ROLE_ORDER}
        for role, proc in procs.items():
            timings[role] = round(_wait_role(deployment, role, proc), 3)
    except BaseException:
        deployment.down()
        raise
    timings["total"] = round(time.monotonic() - started, 3)
    deployment.timings = timings
    return deployment


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
    import sys

    directory = Path(settings.directory)
    restart = f"{sys.executable} -m forensics twin restart {{role}} --inventory {inventory_path}"
    engines = []
    for role, port in (("prefill", settings.prefill_port), ("decode", settings.decode_port),
                       ("router", settings.router_port)):
        engines.append(inventory_mod.Engine(
            role=role, host=inventory_mod.Host("local"), url=settings.url(port), python=sys.executable,
            sglang_location=settings.sglang_root,
            bootstrap_port=settings.bootstrap_port if role == "prefill" else None,
            log_file=str(processes.log_file(directory, role)),
            stderr_file=str(processes.log_file(directory, role)),
            process="sglang::router" if role == "router" else "sglang::scheduler",
            pid_file=str(processes.pid_file(directory, role)),
            restart=restart.format(role=role),
        ))
    return inventory_mod.Inventory(
        name=f"twin-{settings.sglang}-{settings.backend}{'-patched' if settings.patched else ''}",
        engines=tuple(engines), sglang=settings.sglang, backend=settings.backend, twin=settings.to_dict(),
    )


def attach(inventory_path: str | Path) -> Deployment:
    """The twin described by an inventory file written by :func:`up`."""
    inv = inventory_mod.load(inventory_path)
    if not inv.is_twin:
        raise TwinError(f"{inventory_path}: not a twin's inventory (no [twin] table)")
    return Deployment(Path(inventory_path))
