"""Real NIXL (UCX, DRAM) transfers of synthetic KV pages between two twin processes.

The decode registers a page pool (one numpy buffer) with its NIXL agent and sends
the agent's metadata and the pool's base pointer to the prefill in the release's
KV-args registration frame. The prefill's agent, which learned the decode agent
through the release's own bootstrap loop (``add_remote_agent``), WRITEs the room's
KV pages straight into that pool and notifies with sglang's tags
(``{room}_kv_{chunk}_{is_last}_{pp_rank}`` then ``{room}_aux``).

Only the model is missing: the KV bytes are a deterministic function of the room,
so the decode can prove that what arrived is what the prefill sent.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from forensics.exitcodes import EnvironmentProblem

DEFAULT_PAGE_BYTES = 4096
AUX_ITEM_BYTES = 64  # one aux slot per request (sglang: metadata buffers)


class NixlUnavailable(EnvironmentProblem):
    """nixl_cu12 (the real NIXL Python API) cannot be imported or cannot create a UCX agent."""


def nixl_api():
    """The real NIXL Python API module (``nixl_cu12._api``)."""
    try:
        import nixl_cu12._api as api
    except ImportError as exc:  # pragma: no cover - the venv ships nixl_cu12
        raise NixlUnavailable(f"cannot import nixl_cu12._api ({exc}); install nixl-cu12 --no-deps") from exc
    return api


def make_agent(name: str | None = None, *, num_threads: int = 0):
    """A NIXL agent with the UCX backend, as sglang creates it (prefill: 8 threads, decode: 0).

    One deviation: its progress thread sleeps between polls (``sandbox.quiet_nixl``), so an
    idle twin does not hold a core per agent.
    """
    from forensics.sandbox.quiet_nixl import quiet_agent

    api = nixl_api()
    config = api.nixl_agent_config(backends=["UCX"], num_threads=num_threads)
    try:
        return quiet_agent(api, name or str(uuid.uuid4()), config)
    except Exception as exc:
        raise NixlUnavailable(f"NIXL could not create a UCX agent: {exc}") from exc


def kv_payload(room: int, nbytes: int) -> np.ndarray:
    """The synthetic KV bytes of ``room``: deterministic, so both sides can compute them."""
    seed = int.from_bytes(hashlib.blake2b(str(room).encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


class FreeList:
    """The page bookkeeping both decode pools share: a free list of page indices under a lock
    (the scheduler allocates and releases from several threads)."""

    _free: list[int]
    _lock: threading.Lock

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> np.ndarray | None:
        """Page indices (int32, as sglang sends them) or None when the pool is full."""
        with self._lock:
            if count > len(self._free):
                return None
            pages, self._free = self._free[:count], self._free[count:]
        return np.asarray(pages, dtype=np.int32)

    def release(self, pages: np.ndarray) -> None:
        with self._lock:
            self._free.extend(int(p) for p in pages)


@dataclass
class PagePool(FreeList):
    """A registered DRAM buffer of ``num_pages`` pages of ``page_bytes`` each, with a free list."""

    agent: object
    num_pages: int
    page_bytes: int = DEFAULT_PAGE_BYTES

    def __post_init__(self) -> None:
        self.buffer = np.zeros(self.num_pages * self.page_bytes, dtype=np.uint8)
        self.registration = self.agent.register_memory(
            [(self.buffer.ctypes.data, self.buffer.nbytes, 0, "")], "DRAM"
        )
        self._free = list(range(self.num_pages))
        self._lock = threading.Lock()

    @property
    def base_ptr(self) -> int:
        return int(self.buffer.ctypes.data)

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def read(self, pages: np.ndarray, nbytes: int) -> np.ndarray:
        """The bytes held by ``pages`` (in order), cut to ``nbytes``."""
        view = self.buffer.reshape(self.num_pages, self.page_bytes)
        return view[np.asarray(pages, dtype=np.int64)].reshape(-1)[:nbytes].copy()

    def clear(self, pages: np.ndarray) -> None:
        view = self.buffer.reshape(self.num_pages, self.page_bytes)
        view[np.asarray(pages, dtype=np.int64)] = 0

    def close(self) -> None:
        try:
            self.agent.deregister_memory(self.registration)
        except Exception:  # teardown is best effort: the agent may already be gone
            pass


def pages_for(nbytes: int, page_bytes: int = DEFAULT_PAGE_BYTES) -> int:
    return max(1, -(-nbytes // page_bytes))


def kv_tag(room: int, chunk_id: int = 0, is_last: bool = True, pp_rank: int = 0) -> bytes:
    """sglang's NIXL KV notification tag ``{room}_kv_{chunk_id}_{is_last}_{pp_rank}``."""
    return f"{room}_kv_{chunk_id}_{int(is_last)}_{pp_rank}".encode("ascii")


def aux_tag(room: int) -> bytes:
    """sglang's NIXL aux notification tag ``{room}_aux``."""
    return f"{room}_aux".encode("ascii")


class TransferFailed(RuntimeError):
    """A NIXL WRITE ended in ERR or did not finish in time."""


def write_pages(
    agent,
    remote_agent: str,
    source: np.ndarray,
    dst_base_ptr: int,
    dst_page_bytes: int,
    dst_pages: np.ndarray,
    notif: bytes,
    *,
    timeout_s: float = 30.0,
) -> None:
    """WRITE ``source`` (registered, contiguous) into the remote pages, then notify with ``notif``.

    Page i of the source goes to ``dst_pages[i]`` of the remote pool, as sglang's
    per-page descriptors do.
    """
    pages = np.asarray(dst_pages, dtype=np.int64)
    src_ptr = int(source.ctypes.data)
    remaining = int(source.nbytes)
    src_descs, dst_descs = [], []
    for i, page in enumerate(pages):
        length = min(dst_page_bytes, remaining - i * dst_page_bytes)
        if length <= 0:
            break
        src_descs.append((src_ptr + i * dst_page_bytes, length, 0))
        dst_descs.append((dst_base_ptr + int(page) * dst_page_bytes, length, 0))
    src = agent.get_xfer_descs(src_descs, "DRAM")
    dst = agent.get_xfer_descs(dst_descs, "DRAM")
    handle = agent.initialize_xfer("WRITE", src, dst, remote_agent, notif)
    try:
        state = agent.transfer(handle)
        deadline = time.monotonic() + timeout_s
        while state != "DONE":
            if state == "ERR":
                raise TransferFailed(f"NIXL WRITE to {remote_agent} failed ({notif.decode()})")
            if time.monotonic() > deadline:
                raise TransferFailed(f"NIXL WRITE to {remote_agent} not done after {timeout_s}s ({notif.decode()})")
            time.sleep(0.0002)
            state = agent.check_xfer_state(handle)
    finally:
        agent.release_xfer_handle(handle)


class RegisteredSource:
    """A prefill-side registered scratch buffer the KV payload is staged in before a WRITE."""

    def __init__(self, agent, nbytes: int) -> None:
        self.agent = agent
        self.buffer = np.zeros(nbytes, dtype=np.uint8)
        self.registration = agent.register_memory([(self.buffer.ctypes.data, self.buffer.nbytes, 0, "")], "DRAM")

    def view(self, nbytes: int) -> np.ndarray:
        return self.buffer[:nbytes]

    def close(self) -> None:
        try:
            self.agent.deregister_memory(self.registration)
        except Exception:  # best effort at teardown
            pass
