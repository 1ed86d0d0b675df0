"""KV memory and NIXL agents for an engine that has no GPU.

A sandboxed engine owns a small KV cache in host memory (numpy buffers: K and V per layer,
plus aux), described by the release's own ``KVArgs``. Its NIXL agent is real (nixl_cu12 over
UCX) when NIXL imports. sglang asks NIXL for ``"VRAM"`` memory on most paths (hard-coded
before 0.5.15, the default kind after), which UCX cannot give without CUDA; the
:class:`HostMemoryAgent` adapter therefore registers and describes that memory as ``"DRAM"``
(device 0) and forwards everything else to the real agent untouched. The release's code
runs its GPU code path; only the physical memory is host memory.

Without NIXL, :class:`RecordingAgent` stands in: it records what the loop registers so
the bootstrap protocol still runs (``SandboxInfo.agent`` says which one was used).
"""

from __future__ import annotations

import itertools
import sys
import uuid
from dataclasses import dataclass, field

import numpy as np

LAYERS = 2
SLOTS = 16
KV_ITEM_BYTES = 64
AUX_ITEM_BYTES = 32


@dataclass
class HostKV:
    """The buffers behind one engine's KVArgs (kept alive as long as the engine)."""

    kv: list[np.ndarray] = field(default_factory=list)
    aux: list[np.ndarray] = field(default_factory=list)

    kv_item_bytes: int = KV_ITEM_BYTES
    aux_item_bytes: int = AUX_ITEM_BYTES

    @classmethod
    def allocate(cls, *, slots: int = SLOTS, kv_item_bytes: int = KV_ITEM_BYTES, aux_slots: int | None = None,
                 aux_item_bytes: int = AUX_ITEM_BYTES) -> HostKV:
        """K and V buffers of ``slots`` items per layer, and one aux buffer (the twin's prefill
        asks for pages as large as its decode's, so the release's transfer moves whole pages)."""
        kv = [np.zeros(slots * kv_item_bytes, dtype=np.uint8) for _ in range(2 * LAYERS)]  # K..., V...
        aux = [np.zeros((aux_slots or slots) * aux_item_bytes, dtype=np.uint8)]
        return cls(kv=kv, aux=aux, kv_item_bytes=kv_item_bytes, aux_item_bytes=aux_item_bytes)

    def kv_args(self, kv_args_class: type, *, engine_rank: int = 0):
        """An instance of the release's ``KVArgs`` describing these buffers (a 1-GPU, TP=1 engine)."""
        return kv_args_for(
            kv_args_class, engine_rank=engine_rank,
            kv_data_ptrs=[buf.ctypes.data for buf in self.kv], kv_data_lens=[buf.nbytes for buf in self.kv],
            kv_item_lens=[self.kv_item_bytes] * len(self.kv),
            aux_data_ptrs=[buf.ctypes.data for buf in self.aux], aux_data_lens=[buf.nbytes for buf in self.aux],
            aux_item_lens=[self.aux_item_bytes] * len(self.aux),
        )


def kv_args_for(kv_args_class: type, *, kv_data_ptrs: list[int], kv_data_lens: list[int], kv_item_lens: list[int],
                aux_data_ptrs: list[int], aux_data_lens: list[int], aux_item_lens: list[int], engine_rank: int = 0):
    """The release's ``KVArgs`` filled as a scheduler's ``_init_kv_manager`` fills it for a 1-GPU,
    TP=1 engine of a ``LAYERS``-layer model: one region per layer's K, then per layer's V.

    ``kv_layer_ids`` (read from 0.5.17 on: the decode packs them into its KV-args registration,
    the prefill pairs its regions with the decode's by them) name each region's model layer, K
    regions first, as a pool with per-layer ids reports them (``get_kv_layer_ids``: ``ids * 2``).
    Both sides of a twin use this one description, so both agree on the layout, as two engines
    serving the same model do. Fields a release does not read are harmless extra attributes.
    """
    args = kv_args_class()
    regions = len(kv_data_ptrs)
    values = {
        "engine_rank": engine_rank,
        "kv_data_ptrs": list(kv_data_ptrs),
        "kv_data_lens": list(kv_data_lens),
        "kv_item_lens": list(kv_item_lens),
        "kv_layer_ids": list(range(regions // 2)) * 2,
        "kv_cache_dtype_str": "auto",
        "kv_layout": None,
        "aux_data_ptrs": list(aux_data_ptrs),
        "aux_data_lens": list(aux_data_lens),
        "aux_item_lens": list(aux_item_lens),
        "state_types": [],
        "state_data_ptrs": [],
        "state_data_lens": [],
        "state_item_lens": [],
        "state_dim_per_tensor": [],
        "state_layer_ids": [],
        "state_slice_outer_counts": [],
        "state_conv_shard_groups": [],
        "is_hybrid_mla_backend": False,
        "swa_kv_cache_layout": None,
        "rust_http_port": None,
        "hidden_kv_layers": regions // 2,
        "draft_kv_layers": 0,
        "state_type": "none",
        "ib_device": None,
        "ib_traffic_class": None,
        "gpu_id": 0,
        "kv_head_num": 1,
        "total_kv_head_num": 1,
        "page_size": 1,
        "system_dp_rank": 0,
        "pp_rank": 0,
        "prefill_start_layer": 0,
        "prefill_end_layer": regions // 2,
        "prefill_pp_size": 1,
        "mla_compression_ratios": None,
        "kv_buf_groups": 1,
        "total_kv_layers": regions // 2,
        "decode_tp_size": 1,
    }
    for name, value in values.items():
        setattr(args, name, value)
    return args


def _as_host(mem_type: str) -> str:
    return "DRAM" if mem_type in ("VRAM", "cuda", "VRAM_SEG") else mem_type


def _host_descs(descs):
    """Device ids of VRAM descriptors become 0 (host memory has one device)."""
    if isinstance(descs, np.ndarray) and descs.ndim == 2 and descs.shape[1] >= 3:
        descs = descs.copy()
        descs[:, 2] = 0
        return descs
    if isinstance(descs, list) and descs and isinstance(descs[0], tuple):
        return [(d[0], d[1], 0, *d[3:]) for d in descs]
    return descs


# Keyword arguments older sglang releases pass that today's NIXL API no longer takes
# (0.5.1.x passes ``is_sorted=False``, a sorting hint dropped from nixl's Python API).
_RETIRED_KWARGS = ("is_sorted",)


class HostMemoryAgent:
    """A real NIXL agent whose ``"VRAM"`` is host memory (see the module docstring).

    Also drops keyword arguments of older NIXL APIs (``_RETIRED_KWARGS``) that the installed
    NIXL rejects, recording each one in ``retired_kwargs_seen`` so a caller can see it happened.
    """

    def __init__(self, agent) -> None:
        self._agent = agent
        self.retired_kwargs_seen: set[str] = set()

    def _compatible(self, kwargs: dict) -> dict:
        for name in _RETIRED_KWARGS:
            if name in kwargs:
                self.retired_kwargs_seen.add(name)
                kwargs = {k: v for k, v in kwargs.items() if k != name}
        return kwargs

    @property
    def real_agent(self):
        return self._agent

    def register_memory(self, descs, mem_type: str | None = None, *args, **kwargs):
        kwargs = self._compatible(kwargs)
        if mem_type is None:
            return self._agent.register_memory(descs, *args, **kwargs)
        return self._agent.register_memory(_host_descs(descs), _as_host(mem_type), *args, **kwargs)

    def get_xfer_descs(self, descs, mem_type: str | None = None, *args, **kwargs):
        kwargs = self._compatible(kwargs)
        if mem_type is None:
            return self._agent.get_xfer_descs(descs, *args, **kwargs)
        return self._agent.get_xfer_descs(_host_descs(descs), _as_host(mem_type), *args, **kwargs)

    def get_reg_descs(self, descs, mem_type: str | None = None, *args, **kwargs):
        kwargs = self._compatible(kwargs)
        if mem_type is None:
            return self._agent.get_reg_descs(descs, *args, **kwargs)
        return self._agent.get_reg_descs(_host_descs(descs), _as_host(mem_type), *args, **kwargs)

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type: str | None = None, *args, **kwargs):
        kwargs = self._compatible(kwargs)
        if mem_type is None:
            return self._agent.prep_xfer_dlist(agent_name, xfer_list, *args, **kwargs)
        return self._agent.prep_xfer_dlist(agent_name, _host_descs(xfer_list), _as_host(mem_type), *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._agent, name)


class RecordingAgent:
    """Stands in for NIXL when it cannot be imported: records registrations, moves no data."""

    _handles = itertools.count(1)

    def __init__(self, name: str) -> None:
        self.name = name
        self.remote_agents: dict[str, bytes] = {}
        self.registered: list[tuple[str, object]] = []

    def get_agent_metadata(self) -> bytes:
        return f"recording-agent:{self.name}".encode()

    def add_remote_agent(self, metadata: bytes) -> bytes:
        name = metadata.split(b":", 1)[-1]
        self.remote_agents[name.decode(errors="replace")] = metadata
        return name

    def register_memory(self, descs, mem_type=None, *args, **kwargs):
        self.registered.append((str(mem_type), descs))
        return ("registered", next(self._handles))

    def get_xfer_descs(self, descs, mem_type=None, *args, **kwargs):
        return ("descs", descs)

    def get_reg_descs(self, descs, mem_type=None, *args, **kwargs):
        return ("descs", descs)

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, *args, **kwargs):
        return ("prepped", agent_name, next(self._handles))

    def check_remote_metadata(self, name, *args, **kwargs) -> bool:
        return name in self.remote_agents

    def get_new_notifs(self):
        return {}

    def __getattr__(self, name: str):
        raise AttributeError(f"RecordingAgent (NIXL unavailable) has no {name}; this path needs real NIXL")


def make_agent(role: str):
    """(agent, description): a real NIXL agent on UCX when NIXL imports, else a RecordingAgent."""
    name = str(uuid.uuid4())
    from forensics.sandbox.shim import nixl_disabled

    if nixl_disabled():
        return RecordingAgent(name), "recording stand-in (NIXL disabled)"
    api = sys.modules.get("nixl._api")
    if api is None:
        try:
            import nixl._api as api  # aliased to nixl_cu12 by the shim when present
        except ImportError:
            api = None
    if api is not None:
        from forensics.sandbox.quiet_nixl import quiet_agent

        config = api.nixl_agent_config(backends=["UCX"])
        return HostMemoryAgent(quiet_agent(api, name, config)), "nixl (real, UCX, host memory)"
    return RecordingAgent(name), "recording stand-in (NIXL not importable)"
