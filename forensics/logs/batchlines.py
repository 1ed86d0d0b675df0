"""Parse sglang's periodic "Prefill batch" / "Decode batch" lines into numbers.

Every variant from 0.5.1 to 0.5.23 is a header (``Prefill batch.`` / ``Prefill batch,``
/ ``Prefill batch [N],``) followed by ``key: value`` fields separated by ", ". Which
fields appear depends on the release, the role, hybrid models and flags, but within
one deployment a handful of field layouts ("shapes") repeat millions of times. So a
layout is parsed slowly once, and every later line with the same layout only has its
values pulled out by one regex call: that is what keeps big journals fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from forensics.logs.batchstore import EXACT_FLOAT_LIMIT, MISSING
from forensics.logs.schema import BATCH_BOOL_FIELDS, BATCH_COUNT_FIELDS

INT64_MAX = np.iinfo(np.int64).max

# Message part only (after any journal or sglang prefix).
HEADER = re.compile(rb"(Prefill|Decode) batch(?: \[(\d+)\])?[.,] ")
VALUES_IN_LINES = re.compile(rb": ([^,\n]*)")  # each value of many field lists joined by newlines
# Deleting these from a line leaves a key that only changes with its layout (not its values).
SHAPE_DELETE = b"0123456789.-"

# Field label as printed -> column. "#prealloc-req" depends on the role (see KIND_SPECIFIC).
FIELD_NAMES: dict[bytes, str] = {
    b"#new-seq": "new_seq",
    b"#new-token": "new_token",
    b"#cached-token": "cached_token",
    b"token usage": "token_usage",
    b"full token usage": "full_token_usage",
    b"swa token usage": "swa_token_usage",
    b"mamba usage": "mamba_usage",
    b"#running-req": "running_req",
    b"#queue-req": "queue_req",
    b"#pending-token": "pending_token",
    b"#bootstrap-req": "bootstrap_req",
    b"#inflight-req": "inflight_req",
    # 0.5.1 - 0.5.2's PD prefill line names the same two queues differently (read from its source)
    b"#unbootstrapped-req": "bootstrap_req",
    b"#transferring-req": "inflight_req",
    b"#optimistic-req": "optimistic_req",
    b"#replay-token": "replay_token",
    b"waiting-image-req": "waiting_image_req",
    b"#waiting-image-req": "waiting_image_req",
    b"#token": "token",
    b"pre-allocated usage": "pre_allocated_usage",
    b"#transfer-req": "transfer_req",
    b"#retracted-req": "retracted_req",
    b"#host-receive-req": "host_receive_req",
    b"accept len": "accept_len",
    b"accept rate": "accept_rate",
    b"cap len": "cap_len",
    b"block accept len": "block_accept_len",
    b"cuda graph": "cuda_graph",
    b"cpu graph": "cuda_graph",
    b"npu graph": "cuda_graph",
    b"musa graph": "cuda_graph",
    b"input throughput (token/s)": "input_throughput",
    b"gen throughput (token/s)": "gen_throughput",
    b"est. prefill TFLOPS/s (per GPU)": "est_prefill_tflops",
    b"est. decode TFLOPS/s (per GPU)": "est_decode_tflops",
    b"est. read BW (GB/s per GPU)": "est_read_bw",
    b"est. write BW (GB/s per GPU)": "est_write_bw",
    b"fwd occupancy": "fwd_occupancy",
}
# Up to 0.5.11 the prefill's bootstrap queue was printed as "#prealloc-req" (renamed in 0.5.12);
# on the decode "#prealloc-req" is the decode prealloc queue.
KIND_SPECIFIC = {(b"Prefill", b"#prealloc-req"): "bootstrap_req", (b"Decode", b"#prealloc-req"): "prealloc_req"}

COUNT_SET = frozenset(BATCH_COUNT_FIELDS)
BOOL_SET = frozenset(BATCH_BOOL_FIELDS)


def column_for(kind: bytes, label: bytes) -> str:
    label = label.strip()
    name = KIND_SPECIFIC.get((kind, label)) or FIELD_NAMES.get(label)
    if name:
        return name
    # A field this catalogue does not know yet (a newer release): keep it, normalised.
    text = label.decode("utf-8", "replace").lower()
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_") or "field"


@dataclass(frozen=True)
class Shape:
    """One field layout: the columns its values fill, in order."""

    kind: str  # "prefill" | "decode"
    columns: tuple[str, ...]
    labels: tuple[bytes, ...] = ()  # the labels as printed, in order


def learn_shape(kind: bytes, fields: bytes) -> Shape | None:
    """Parse a field list slowly to learn its layout; None when it is not a batch field list."""
    columns = []
    labels = []
    # Up to 0.5.8.post1 sglang ends some batch lines with the separator ("#queue-req: 0, "): no field.
    for part in fields.rstrip(b"\r\n").removesuffix(b", ").split(b", "):
        label, sep, _value = part.rpartition(b": ")
        if not sep:
            return None
        columns.append(column_for(kind, label))
        labels.append(label)
    if not columns:
        return None
    return Shape(kind=kind.decode().lower(), columns=tuple(columns), labels=tuple(labels))


_KEEP_IN_NUMBERS = frozenset(b"0123456789.,")
_DELETE_ALL_BUT_NUMBERS = bytes(b for b in range(256) if b not in b"0123456789.,\n")


_PLAIN_VALUE_BYTES = b"0123456789., %\r\n"


def _plain_values(shape: Shape, joined: bytes, rows: int) -> bool:
    """Whether every value is unsigned digits (with a dot or %) or a boolean where booleans belong.

    Deleting labels leaves only the values; a sign, an exponent, text, or a True/False under
    a numeric label would be misread by the bulk path ("-1" as 1, "3.5e1" as 35 or 3), so
    such groups take the per-value path, which reads each value as it is written.
    """
    values = joined
    for label in sorted(set(shape.labels), key=len, reverse=True):  # "full token usage" before "token usage"
        values = values.replace(label + b": ", b"")
    booleans = values.count(b"True") + values.count(b"False")
    if booleans != rows * sum(name in BOOL_SET for name in shape.columns):
        return False
    values = values.replace(b"True", b"").replace(b"False", b"")
    return not values.translate(None, _PLAIN_VALUE_BYTES)


def number_table(shape: Shape, fields: list[bytes]) -> np.ndarray | None:
    """All values of many field lists of one shape as a (rows x fields) float table, in C.

    The labels are fixed for a shape, so deleting them (with their separators) leaves
    only numbers and booleans, which numpy reads in one pass. None when anything else
    is left over (the caller then takes the slower, per-value path).
    """
    if not shape.labels:
        return None
    if any(_KEEP_IN_NUMBERS.intersection(label) for label in shape.labels):
        return None  # a label with digits or dots ("est. ... TFLOPS") would leave text behind
    joined = b"\n".join(f.rstrip(b"\r").removesuffix(b", ") for f in fields)  # a trailing separator (<= 0.5.8)
    if not _plain_values(shape, joined, len(fields)):
        return None
    blob = joined.replace(b"True", b"1").replace(b"False", b"0")
    # Labels hold no digits, so deleting every byte but digits, dots, commas and newlines
    # leaves exactly the values, comma-separated.
    blob = blob.translate(None, _DELETE_ALL_BUT_NUMBERS).replace(b"\n", b",")
    try:
        numbers = np.fromstring(blob, dtype=np.float64, sep=",")
    except ValueError:
        return None
    if numbers.size != len(fields) * len(shape.labels):
        return None
    if numbers.size and np.abs(numbers).max() >= EXACT_FLOAT_LIMIT:
        return None  # a value a double cannot hold exactly: the exact text path reads it
    return numbers.reshape(len(fields), len(shape.labels))


def columns_from_numbers(shape: Shape, table: np.ndarray) -> dict[str, np.ndarray]:
    return {name: (table[:, index] == 1.0) if name in BOOL_SET else table[:, index]
            for index, name in enumerate(shape.columns)}


def columns_from_table(shape: Shape, table: np.ndarray) -> dict[str, np.ndarray]:
    """Numeric columns from a (rows x fields) table of value texts of one shape."""
    out: dict[str, np.ndarray] = {}
    for index, name in enumerate(shape.columns):
        column = table[:, index]
        if name in BOOL_SET:
            out[name] = column == b"True"
            continue
        if name in COUNT_SET:
            out[name] = _exact_counts(column)
            continue
        try:
            out[name] = column.astype(np.float64)
        except ValueError:
            out[name] = np.array([_to_float(v.strip()) for v in column], dtype=np.float64)
    return out


def _exact_counts(column: np.ndarray) -> np.ndarray:
    """Counter texts as exact int64 (``MISSING`` where a value is not an integer that fits)."""
    out = np.empty(len(column), dtype=np.int64)
    for index, text in enumerate(column.tolist()):
        text = text.strip().rstrip(b"%")
        try:
            value = int(text)
        except ValueError:
            value = MISSING
        out[index] = value if MISSING < value <= INT64_MAX else MISSING
    return out


def _to_float(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")
