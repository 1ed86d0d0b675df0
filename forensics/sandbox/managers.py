"""How the sandbox builds a release's KV manager without its ``__init__``.

``__init__`` needs GPUs, torch.distributed and a bootstrap HTTP server, so the sandbox makes
the object with ``cls.__new__`` and fills it in three layers: the release's own initial
values for its bookkeeping (read from the ``__init__`` source, :mod:`.init_defaults`); the
values the sandbox decides for a single TP=1 rank on 127.0.0.1 (sockets, agent, KV geometry,
ranks, timeouts from the release's ``environ``); and, for Mooncake, a stand-in for the RDMA
transfer engine that only answers its session id. Used by both sides (prefill and decode).
"""

from __future__ import annotations

import collections
import sys
import threading
import types

from forensics.sandbox.errors import SandboxError
from forensics.sandbox.init_defaults import initial_values


def server_args() -> types.SimpleNamespace:
    """The ServerArgs fields the sender and loop read, for a 1-GPU prefill without DP."""
    return types.SimpleNamespace(
        dp_size=1,
        tp_size=1,
        enable_dp_attention=False,
        load_balance_method="round_robin",
        pp_size=1,
        host="127.0.0.1",
        disaggregation_bootstrap_port=8998,
        dist_init_addr=None,
        disaggregation_decode_enable_radix_cache=False,
        enable_hisparse=False,
        disaggregation_transfer_backend="nixl",
        enable_pd_role_switch=False,
        kv_cache_dtype="auto",
        page_size=1,
    )


def manager_class(module: types.ModuleType, backend: str) -> type:
    names = {"nixl": "NixlKVManager", "mooncake": "MooncakeKVManager"}
    if backend not in names:
        raise SandboxError(f"backend {backend!r} is not supported by the sandbox (nixl, mooncake)")
    try:
        return getattr(module, names[backend])
    except AttributeError as exc:
        raise SandboxError(f"{module.__file__} defines no {names[backend]}") from exc


def common_manager_state(mgr, mode, *, socket, port: int, host: str, agent, kv_args) -> None:
    """Attributes CommonKVManager.__init__ (and the backend's) would set, for one TP=1 rank."""
    envs = sglang_envs()
    values = {
        "kv_args": kv_args,
        "kv_item_lens_sum": sum(kv_args.kv_item_lens),
        "state_item_lens_sum": 0,
        "is_mla_backend": False,
        "disaggregation_mode": mode,
        "server_args": server_args(),
        "bootstrap_host": host,
        "bootstrap_port": 8998,
        "dist_init_addr": None,
        "attn_tp_size": 1,
        "attn_tp_rank": 0,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "attn_dp_size": 1,
        "attn_dp_rank": 0,
        "system_dp_size": 1,
        "system_dp_rank": 0,
        "pp_size": 1,
        "pp_rank": 0,
        "tp_size": 1,
        "tp_rank": 0,
        "engine_rank": 0,
        "local_ip": host,
        "rank_port": port,
        "server_socket": socket,
        "enable_all_cp_ranks_for_transfer": False,
        "request_status": {},
        "_socket_cache": {},
        "_monitor_cache": {},
        "_socket_lock": threading.Lock(),
        "failure_records": {},
        "failure_lock": threading.Lock(),
        "agent": agent,
        "enable_staging": False,
        "_staging_ctx": None,
        "_staging_handler": None,
        "kv_buffer_tensors": None,
        "prep_handles": {},
        "prep_handle_slice_src": None,
        "prep_handles_slice_dst": {},
        "prep_handles_segment_src": {},
        "_num_slots_src": kv_args.kv_data_lens[0] // kv_args.kv_item_lens[0],
        "src_mem_kind": "VRAM",
        "deferred_bootstrap": None,
        "sender_trace_module": None,
        "receiver_trace_module": None,
        "bootstrap_timeout": env_value(envs, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300),
        "waiting_timeout": env_value(envs, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300),
        "heartbeat_interval": 5.0,
        "max_failures": 2,
        # 0.5.18+: decode context parallelism, sharding, deferred ABORT_ACK bookkeeping.
        "kv_cache_dtype_str": "auto",
        "kv_layout": None,
        "dsv41_spec_layout": None,
        "_kv_replica_factor": 1,
        "is_hybrid_mla_backend": False,
        "_dcp_pack_buffers": None,
        "_dcp_pack_max_tokens": None,
        "state_tp_size": 1,
        "dcp_size": 1,
        "dcp_rank": 0,
        "kv_shard_rank": 0,
        "kv_shard_size": 1,
        "_socket_send_locks": {},
        "_staging_outstanding": collections.defaultdict(int),
        "_deferred_ack_targets": {},
        "_deferred_ack_poisoned_rooms": set(),
        "defer_decode_allocation": False,
        "_deferred_abort_ack_tracker": {},
        "_deferred_abort_generation": 0,
        "_heartbeat_shutdown": threading.Event(),
        "_prepared_state_plans": {},
        "_state_layout_rejections": {},
        "_prepared_state_components": set(),
    }
    # 0.5.17+ (NixlKVManager.__init__): the rank its transfer_worker writes into every KV, state
    # and aux notification tag (``{room}_kv_{chunk}_{last}_{rank}``); before 0.5.17 the tags
    # carry kv_args.engine_rank. Without it every transfer fails with an AttributeError inside
    # the worker's try/except: the prefill marks the room Failed, while a 0.5.17 to 0.5.19 decode
    # (no KV_STATUS from the prefill) waits out its waiting timeout.
    values["transfer_source_rank"] = kv_args.pp_rank * values["server_args"].tp_size + kv_args.engine_rank
    for name, value in values.items():
        setattr(mgr, name, value)
    # As CommonKVManager.__init__ (0.5.19+): the release default, where the backend supports it.
    mgr.enable_deferred_decode_kv_release = bool(
        env_value(envs, "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", False)
        and getattr(mgr, "supports_deferred_decode_kv_release", False)
    )
    kv_args.kv_data_mem_kinds = ["VRAM"] * len(kv_args.kv_data_ptrs)


class SingleRankGroup:
    """What ``get_pp_group()`` (torch.distributed, stubbed) answers for a pipeline of one rank:
    ``CommonKVManager.__init__`` stores it as ``pp_group`` up to 0.5.9, and Mooncake's
    ``transfer_worker`` of those releases sends the aux data only ``if self.pp_group.is_last_rank``."""

    world_size = 1
    rank_in_group = 0
    is_first_rank = True
    is_last_rank = True

    def __repr__(self) -> str:
        return "SingleRankGroup()"


class MooncakeSessionStandIn:
    """Stands in for the Mooncake transfer engine (RDMA; cannot run here): only its session id.

    The bootstrap loop never touches the engine; the decode puts this id in its frames.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id

    def get_session_id(self) -> str:
        return self.session_id

    def __repr__(self) -> str:
        return f"MooncakeSessionStandIn({self.session_id!r})"


def mooncake_state(mgr, host: str, port: int, engine=None) -> None:
    """Attributes MooncakeKVManager.__init__ sets that its bootstrap and decode threads read.

    ``engine``: the release's real ``MooncakeTransferEngine`` (the twin's, over TCP); without
    one, :class:`MooncakeSessionStandIn` (the bootstrap loop alone never touches the engine)."""
    values = {
        "engine": engine if engine is not None else MooncakeSessionStandIn(f"{host}:{port}"),
        "session_lock": threading.Lock(),
        "failed_sessions": set(),
        "session_failures": collections.defaultdict(int),
        "_stopped": False,
        "_worker_threads": [],
        "executors": [],
        "enable_trace": False,
        "enable_failed_session_probe": False,
        "failed_session_probes": {},
        "state_layout_rejections": {},
        "state_strides_validated": set(),
        # 0.5.20+: the cap on indices per batch transfer, compared with sizes in send_kvcache.
        "max_transfer_batch_indices": env_value(sglang_envs(), "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES", None),
    }
    for name, value in values.items():
        setattr(mgr, name, value)
    # Up to 0.5.9 mooncake/conn.py formats the decode's PUSH endpoint (format_tcp_address) and reads
    # its queue sizes (get_int_env_var) with helpers of the stubbed sglang.srt.utils: the
    # release's own definitions take the stubs' place, so a status PUSH reaches a real address.
    from forensics.sandbox.release_utils import serve_release_helpers
    from forensics.sandbox.shim import loaded_release

    release = loaded_release()
    if release is not None:
        serve_release_helpers(vars(sys.modules[type(mgr).__module__]), release.root)


def set_initial_values(obj) -> None:
    """The release's own initial values for the bookkeeping its ``__init__`` sets (see init_defaults)."""
    for name, value in initial_values(type(obj)).items():
        setattr(obj, name, value)


def sglang_envs():
    environ = sys.modules.get("sglang.srt.environ")
    return getattr(environ, "envs", None) if environ is not None else None


def env_value(envs, name: str, default):
    try:
        return getattr(envs, name).get()
    except Exception:
        return default
