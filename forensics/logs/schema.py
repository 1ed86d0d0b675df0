"""Column schemas of the log Evidence frames, written down once.

Notebooks, the diagnosis and the report read these frames by column name, so the
names and dtypes here are a contract: change them only with the docs table in
docs/logs.md.
"""

from __future__ import annotations

# One row per signature event (thread deaths, transfer failures, aborts, timeouts, ...).
EVENT_COLUMNS: dict[str, str] = {
    "ts": "datetime64[ns, UTC]",  # tz-aware; NaT when no time could be found or inferred
    "ts_source": "string",  # journal | sglang | inferred | none
    # When ts was inferred from the line before, the time of the next timed line: the true
    # time lies in [ts, ts_upper]. NaT otherwise.
    "ts_upper": "datetime64[ns, UTC]",
    "host": "string",
    "role": "string",  # prefill | decode | router | unknown
    "unit": "string",  # systemd unit or syslog identifier when the source is a journal
    "source": "string",  # file path (or journal file) the row came from
    "line": "Int64",  # 1-based line number in that source (journal output line for journals)
    "signature": "string",  # catalogue id
    "severity": "string",  # critical | error | warning | info | debug
    "step": "string",  # kill-chain step of the signature
    # Bootstrap room when the line names one: exact over [0, 2**64) (random 63-bit values, plus
    # room + i for n > 1). Never a float; a string of digits in JSON.
    "room": "UInt64",
    "rid": "string",
    "rank": "Int64",  # tp rank from the message (rank=N) or the sglang prefix
    "dp_rank": "Int64",
    "pp_rank": "Int64",
    "thread": "string",  # thread name and target of a thread death, e.g. "Thread-3 (bootstrap_thread)"
    "message": "string",  # the log message; for a thread death its final exception line
    "raw": "string",  # the line(s) as written, truncated to RAW_LIMIT characters
    "offset": "Int64",  # byte offset of the first line in the (decompressed) source
}

# One row per "Prefill batch" / "Decode batch" line. Millions of rows are normal, so the
# texts are categories and the numbers 32-bit.
BATCH_ID_COLUMNS: dict[str, str] = {
    "ts": "datetime64[ns, UTC]",
    "ts_source": "category",
    "host": "category",
    "role": "category",
    "source": "category",
    "kind": "category",  # prefill | decode
    "iter": "Int64",  # forward iteration when the line carries "[N]" (exact)
    "dp_rank": "Int32",
    "tp_rank": "Int32",
    "pp_rank": "Int32",
}
# Numeric batch fields, by normalised name. Counts are exact nullable Int64 (never through a
# float), ratios float32;
# a field a release does not print is <NA>/NaN in its rows, and a documented field no
# line printed at all is an all-missing sparse column (it costs no memory per row).
BATCH_COUNT_FIELDS = (
    "new_seq", "new_token", "cached_token", "running_req", "queue_req", "pending_token",
    "bootstrap_req", "inflight_req", "optimistic_req", "replay_token", "waiting_image_req",
    "token", "prealloc_req", "transfer_req", "retracted_req", "host_receive_req",
)
BATCH_FLOAT_FIELDS = (
    "token_usage", "full_token_usage", "swa_token_usage", "mamba_usage", "pre_allocated_usage",
    "accept_len", "accept_rate", "cap_len", "block_accept_len", "input_throughput",
    "gen_throughput", "est_prefill_tflops", "est_decode_tflops", "est_read_bw", "est_write_bw",
    "fwd_occupancy",
)
BATCH_BOOL_FIELDS = ("cuda_graph",)

# High-volume uvicorn access lines are aggregated per minute instead of kept one by one.
ACCESS_COLUMNS: dict[str, str] = {
    "minute": "datetime64[ns, UTC]",
    "host": "string",
    "role": "string",
    "source": "string",
    "method": "string",
    "path": "string",
    "status": "Int64",
    "count": "Int64",
    "signature": "string",  # access_health, access_metrics, access_completion or <NA>
}

RAW_LIMIT = 4000  # characters of raw text kept per event; the offset points at the rest
