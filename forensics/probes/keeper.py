"""The probe keeper: holds a finished command's open probe connections until their answers.

A probe never closes its request early (docs/probes.md): on sglang 0.5.13 to 0.5.15.post1 a
client that disconnects before its answer becomes an ``AbortReq``, then an ABORT frame that
kills the NIXL prefill's ``bootstrap_thread``. A command (or a notebook kernel) that ends while
a probe is still open would be exactly that client, because the OS closes a process's sockets
when it exits. So at exit the runner hands each open connection to this keeper: a detached
process that inherits the sockets' file descriptors (the connection is shared, so the
caller's exit closes nothing the server can see), reads and discards the rest of each answer,
and closes a connection only once the server closed it (probes ask ``Connection: close``)
or at the probe's own hard cap, exactly as the probe itself would have.

This file runs as a script in a fresh interpreter (``python -I keeper.py --hold``) and uses
only the standard library, so starting it does not import the library (pandas) at the exit of
a command. Its spec comes on stdin as JSON; it answers ``ready <pid>`` on stdout once it holds
the sockets, and keeps a record (JSON, mode 0600) in the record directory that the next
command reads (``forensics.probes.handover``): the keeper is found again by pid, start time
(``/proc/<pid>/stat`` field 22, clock ticks) and command line.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import time

HOLD_FLAG = "--hold"
RECORD_PREFIX = "keeper-"
DONE_PREFIX = "done-"
CHUNK = 65536


def start_ticks(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[19])


def write_record(path: str, record: dict) -> None:
    """Replace ``path`` atomically with ``record`` (0600: it names the deployment's URLs)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    os.replace(tmp, path)


def _status_line(head: bytes) -> int | None:
    """The HTTP status in a response's first line, if the keeper saw it (the caller may have read it)."""
    if not head.startswith(b"HTTP/"):
        return None
    parts = head.split(b"\r\n", 1)[0].split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def hold(spec: dict) -> dict:
    """Hold every connection of ``spec`` until the server closes it or its cap; the final record."""
    record_dir = spec["record_dir"]
    pid = os.getpid()
    path = os.path.join(record_dir, f"{RECORD_PREFIX}{pid}.json")
    record = {"pid": pid, "start_ticks": start_ticks(), "started_at": time.time(),
              "caller": spec.get("caller", {}), "probes": []}
    selector = selectors.DefaultSelector()
    held: dict[int, tuple[socket.socket, dict, bytearray]] = {}
    for probe in spec["probes"]:
        entry = {key: probe.get(key) for key in ("probe_id", "leg", "target", "role", "kind", "url", "rid", "room",
                                                 "sent_at", "cap_at")}
        entry.update(state="held", bytes_after_handover=0, status=None, ended_at=None, detail="")
        record["probes"].append(entry)
        try:
            sock = socket.socket(fileno=probe["fd"])
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        except OSError as exc:
            entry.update(state="error", ended_at=time.time(), detail=f"the handed socket was unusable: {exc}")
            continue
        held[sock.fileno()] = (sock, entry, bytearray())
    write_record(path, record)
    print(f"ready {pid}", flush=True)
    sys.stdout.close()

    def end(fd: int, state: str, detail: str) -> None:
        sock, entry, _ = held.pop(fd)
        entry.update(state=state, ended_at=time.time(), detail=detail)
        try:
            selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()  # the server closed it, or the cap passed: the probe's own rule
        write_record(path, record)

    while held:
        now = time.time()
        for fd, (_sock, entry, _head) in list(held.items()):
            if now >= entry["cap_at"]:
                end(fd, "unanswered", "no answer within the probe's cap; closed now, as the probe would have")
        if not held:
            break
        wait = max(min(e["cap_at"] for _, e, _ in held.values()) - now, 0.0)
        for key, _events in selector.select(timeout=min(wait, 3600.0)):
            fd = key.fd
            sock, entry, head = held[fd]
            try:
                data = sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                end(fd, "error", f"{type(exc).__name__}: {exc}")
                continue
            if not data:
                status = _status_line(bytes(head))
                entry["status"] = status
                end(fd, "answered", "the server finished its answer and closed the connection")
                continue
            entry["bytes_after_handover"] += len(data)
            if len(head) < 512:
                head.extend(data[: 512 - len(head)])
    record["finished_at"] = time.time()
    done = os.path.join(record_dir, f"{DONE_PREFIX}{RECORD_PREFIX}{pid}.json")
    write_record(done, record)
    os.unlink(path)
    return record


def main(argv: list[str]) -> int:
    if HOLD_FLAG not in argv:
        print("usage: keeper.py --hold < spec.json (started by forensics.probes.handover)", file=sys.stderr)
        return 2
    # A terminal's Ctrl-C or hang-up was meant for the caller, not for the connections it handed over.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spec = json.loads(sys.stdin.read())
    hold(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
