"""Keep the transfer engines the twin and the sandbox start on the loopback interface.

The twin promises 127.0.0.1, and what its engines listen on is memory another process can
write into, so no listener may face the network:

* **NIXL (UCX).** Left alone, UCX opens its TCP listener on the machine's first network
  interface (measured here: each scheduler LISTENed on the eth0 address).
  ``UCX_NET_DEVICES=lo`` (:data:`UCX_LOOPBACK`) keeps it on 127.0.0.1; UCX reads it when an
  agent's context is created, so :func:`confine_ucx` sets it in the process before every agent
  the project builds, and the twin's launcher puts it in each role's environment as well (so
  the process's own environment says so).
* **Mooncake.** The transfer engine binds its P2P handshake RPC listener to ``INADDR_ANY`` and
  its TCP transport's to ``::`` (dual stack), hard-coded (``transfer_metadata_plugin.cpp``,
  ``tcp_transport_session_impl.h``); ``MC_TCP_BIND_ADDRESS`` only changes the address it
  advertises. :func:`confine_mooncake` points the engine libraries' own ``bind`` import at a
  callback (:mod:`.plt_hook`) that turns a wildcard address into the engine's host
  (``::`` into ``::ffff:<host>`` on a dual-stack socket, so IPv4 peers still connect), then
  calls libc's ``bind``. Nothing else in the process is affected.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import threading
from pathlib import Path

from forensics.sandbox.plt_hook import PltHookError, got_slots, loaded_objects, write_slot

UCX_LOOPBACK = {"UCX_NET_DEVICES": "lo"}

_BIND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, use_errno=True)
_libc = ctypes.CDLL(None, use_errno=True)
_real_bind = _libc.bind  # dlsym's answer: libc's own bind, which no GOT slot change touches
_real_bind.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
_real_bind.restype = ctypes.c_int
_lock = threading.Lock()
_hooked: set[int] = set()  # GOT slot addresses already pointing at _hook
_host = {"ipv4": b"\x7f\x00\x00\x01"}  # where a wildcard bind goes (the engine's host, IPv4)


def confine_ucx() -> None:
    """Set :data:`UCX_LOOPBACK` in this process, before a NIXL agent's UCX context is created."""
    os.environ.update(UCX_LOOPBACK)


def _loopback_bind(fd: int, address: int, length: int) -> int:
    """``bind(fd, address, length)`` with a wildcard address replaced by the engine's host."""
    family = ctypes.c_ushort.from_address(address).value if address else None
    buffer = None
    if family == socket.AF_INET and length >= 16 and ctypes.string_at(address + 4, 4) == b"\0" * 4:
        buffer = ctypes.create_string_buffer(ctypes.string_at(address, length), length)
        ctypes.memmove(ctypes.addressof(buffer) + 4, _host["ipv4"], 4)
    elif family == socket.AF_INET6 and length >= 28 and ctypes.string_at(address + 8, 16) == b"\0" * 16:
        buffer = ctypes.create_string_buffer(ctypes.string_at(address, length), length)
        v6only = ctypes.c_int(0)
        size = ctypes.c_uint32(ctypes.sizeof(v6only))
        _libc.getsockopt(fd, socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, ctypes.byref(v6only), ctypes.byref(size))
        # A dual-stack socket keeps taking IPv4 peers on the IPv4-mapped host; a v6-only one gets ::1.
        local = b"\0" * 10 + b"\xff\xff" + _host["ipv4"] if not v6only.value else socket.inet_pton(
            socket.AF_INET6, "::1")
        ctypes.memmove(ctypes.addressof(buffer) + 8, local, 16)
    # errno: _real_bind's lands in ctypes' per-thread copy, which the callback hands back on return.
    return _real_bind(fd, buffer if buffer is not None else address, length)


def _guarded_bind(fd: int, address: int, length: int) -> int:
    """:func:`_loopback_bind`, failing closed: an exception in Python becomes a failed bind
    (EADDRNOTAVAIL, which the engine reports), never a silent 0 nor a wildcard listener."""
    try:
        return _loopback_bind(fd, address, length)
    except Exception:  # noqa: BLE001 - nothing may escape into C++; the engine sees a failed bind
        ctypes.set_errno(errno.EADDRNOTAVAIL)
        return -1


_hook = _BIND(_guarded_bind)  # kept for the life of the process: the GOT slots point at it


def confine_mooncake(host: str = "127.0.0.1") -> int:
    """Make the loaded Mooncake engine libraries bind wildcard listeners to ``host`` (a loopback
    IPv4 address); returns how many GOT slots now point at the hook. Call after ``mooncake.engine``
    is imported and before an engine initializes. Raises :class:`PltHookError` naming the library
    whose slot cannot be found (the caller refuses to start an engine that would face the network)."""
    import mooncake

    address = ipaddress.ip_address(socket.gethostbyname(host))
    if not address.is_loopback:
        raise PltHookError(f"the Mooncake engine is kept on loopback; host {host!r} is {address}")
    package = Path(mooncake.__file__).resolve().parent
    objects = {**loaded_objects(package), **loaded_objects(package.parent / "mooncake_transfer_engine_non_cuda.libs")}
    with _lock:
        _host["ipv4"] = address.packed
        for path, base in objects.items():
            for offset in got_slots(path, "bind"):
                if base + offset not in _hooked:
                    write_slot(base + offset, ctypes.cast(_hook, ctypes.c_void_p).value)
                    _hooked.add(base + offset)
        if not _hooked:
            raise PltHookError(f"{package}: no loaded Mooncake library imports bind (cannot keep it on loopback)")
        return len(_hooked)
