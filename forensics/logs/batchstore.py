"""Batch rows of one source, kept column by column in compact pieces until the scan ends.

A busy deployment prints millions of batch lines; a DataFrame per chunk concatenated at
the end holds every row twice and in wide types. Here each ratio field is kept as
float32 pieces (NaN where a line did not print it), each counter (and the iteration
number) as exact int64 pieces (``MISSING`` where a line did not print it: counters never
pass through a float), ranks as int32, times as int64, and the few distinct texts
(kind, host, unit) as small codes. ``frame()`` builds the final columns
one at a time, freeing the pieces as it goes, so the peak is about one copy of the
compact result.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from forensics.logs.schema import BATCH_BOOL_FIELDS, BATCH_COUNT_FIELDS

COUNT_SET = frozenset(BATCH_COUNT_FIELDS) | {"iter"}  # exact Int64 columns
RANK_SET = frozenset({"dp_rank", "tp_rank", "pp_rank"})  # small ids: Int32
BOOL_SET = frozenset(BATCH_BOOL_FIELDS)
MISSING = np.iinfo(np.int64).min  # an integer cell a line did not print
EXACT_FLOAT_LIMIT = 2**53  # floats hold every integer below this exactly


def as_counts(values) -> np.ndarray:
    """Integer cells as int64 with ``MISSING`` for absent ones.

    Integer input is taken as it is (negative rank codes from the compiled scanner mean
    absent); float input (NaN = absent) must hold only integers below 2**53, which a
    double represents exactly: the parsers hand larger values to the exact text path. A
    float with a fraction is absent too.
    """
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    # A count printed with a fraction ("#transfer-req: 1.2") is no count: absent, as the
    # Python path reads it, never truncated to 1.
    missing = np.isnan(values) | (values != np.trunc(values))
    counts = np.where(missing, 0, values).astype(np.int64)
    counts[missing] = MISSING
    return counts
TEXT_COLUMNS = ("ts_source", "kind", "host", "unit")


class BatchStore:
    def __init__(self) -> None:
        self.rows = 0
        self.numbers: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
        self.times: list[tuple[int, np.ndarray]] = []
        self.texts: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
        self.vocabulary: dict[str, dict[str | None, int]] = defaultdict(dict)

    def __len__(self) -> int:
        return self.rows

    def _code(self, column: str, value: str | None) -> int:
        vocabulary = self.vocabulary[column]
        code = vocabulary.get(value)
        if code is None:
            code = vocabulary[value] = len(vocabulary)
        return code

    def add(self, n: int, times: np.ndarray, numbers: dict[str, np.ndarray], constants: dict[str, str],
            per_row: dict[str, list[str | None]],
            coded: dict[str, tuple[np.ndarray, list[str | None]]] | None = None,
            numbers_at: list[tuple[np.ndarray, dict[str, np.ndarray]]] | None = None) -> None:
        """Append ``n`` rows: times (datetime64[ns] UTC, naive), numeric columns, texts.

        ``coded`` gives text columns as (codes per row, the text of each code), as the
        compiled scanner returns them, so no Python step runs per row. ``numbers_at``
        gives columns that only some of the rows have, as (positions among the ``n``
        rows, {column: values}): rows of several layouts keep file order without a NaN
        cell per row for every other layout's fields. An all-NaN column is kept as its
        name only (``frame()`` fills it).
        """
        offset = self.rows
        self.times.append((offset, np.asarray(times, dtype="datetime64[ns]")))
        for name, values in numbers.items():
            values = _compact(name, values)
            if len(values) and _all_missing(values):
                self.numbers[name]  # noqa: B018 - registers the column, stores nothing
                continue
            self.numbers[name].append((offset, values, None))
        for positions, columns in numbers_at or ():
            for name, values in columns.items():
                self.numbers[name].append((offset, _compact(name, values), positions))
        for name, value in constants.items():
            # A read-only broadcast view: one code, no memory per row.
            self.texts[name].append((offset, np.broadcast_to(np.int16(self._code(name, value)), (n,))))
        for name, values in per_row.items():
            codes = {value: self._code(name, value) for value in set(values)}
            self.texts[name].append((offset, np.fromiter((codes[v] for v in values), dtype=np.int16, count=n)))
        for name, (row_codes, texts) in (coded or {}).items():
            lookup = np.array([self._code(name, text) for text in texts], dtype=np.int16)
            self.texts[name].append((offset, lookup[row_codes]))
        self.rows += n

    def frame(self, source: str, default_host: str, role_of_unit, role: str, explicit_role: str | None) -> pd.DataFrame:
        n = self.rows
        columns: dict[str, object] = {}
        stamps = np.full(n, np.datetime64("NaT"), dtype="datetime64[ns]")
        for offset, piece in self.times:
            stamps[offset: offset + len(piece)] = piece
        self.times = []
        columns["ts"] = pd.DatetimeIndex(stamps).tz_localize("UTC")
        for name in TEXT_COLUMNS:
            columns[name] = self._categorical(name, n)
        host = columns["host"]
        if host.isna().any():
            if default_host not in host.categories:
                host = host.add_categories([default_host])
            host = host.fillna(default_host)
        columns["host"] = host
        columns["source"] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[source])
        if explicit_role:
            columns["role"] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[explicit_role])
        else:
            unit = columns["unit"]
            mapping = [role_of_unit(u, role) for u in unit.categories]
            codes = unit.codes
            categories = sorted(set(mapping) | {role})
            lookup = np.array([categories.index(m) for m in mapping] + [categories.index(role)], dtype=np.int8)
            columns["role"] = pd.Categorical.from_codes(lookup[np.where(codes >= 0, codes, len(mapping))],
                                                        categories=categories)
        for name in list(self.numbers):
            full = np.full(n, MISSING, dtype=np.int64) if _is_integer(name) else np.full(n, np.nan, dtype=np.float32)
            for offset, piece, positions in self.numbers.pop(name):
                if positions is None:
                    full[offset: offset + len(piece)] = piece
                else:
                    full[offset + positions] = piece
            columns[name] = _typed(name, full)
            # The pieces just freed are many small heap blocks that glibc keeps unless asked:
            # hand them back now, so the peak is about one copy of the data, not two.
            _release_freed_memory()
        return pd.DataFrame(columns, copy=False)

    def _categorical(self, name: str, n: int) -> pd.Categorical:
        vocabulary = self.vocabulary.get(name, {})
        codes = np.full(n, -1, dtype=np.int16)
        for offset, piece in self.texts.pop(name, []):
            codes[offset: offset + len(piece)] = piece
        categories = list(vocabulary)
        if None in vocabulary:
            none_code = vocabulary[None]
            codes = np.where(codes == none_code, -1, codes - (codes > none_code)).astype(np.int16)
            categories.remove(None)
        return pd.Categorical.from_codes(codes, categories=categories)


def _libc_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def _release_freed_memory() -> None:
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _is_integer(name: str) -> bool:
    return name in COUNT_SET or name in RANK_SET


def _compact(name: str, values) -> np.ndarray:
    """One piece in its stored type: int64 counters, int64 ranks (negative: absent), float32 else."""
    if name in COUNT_SET:
        return as_counts(values)
    if name in RANK_SET:
        counts = as_counts(values)
        return np.where(counts < 0, MISSING, counts)
    return np.asarray(values, dtype=np.float32)


def _all_missing(values: np.ndarray) -> bool:
    return bool((values == MISSING).all()) if values.dtype == np.int64 else bool(np.isnan(values).all())


def _typed(name: str, values: np.ndarray):
    if _is_integer(name):
        missing = values == MISSING
        values[missing] = 0  # in place: the column is ours, a copy would double its peak
        if name in RANK_SET:
            return pd.arrays.IntegerArray(values.astype(np.int32), missing)
        return pd.arrays.IntegerArray(values, missing)
    missing = np.isnan(values)
    if name in BOOL_SET:
        return pd.arrays.BooleanArray(values == 1.0, missing)
    return values  # float32, NaN where not printed
