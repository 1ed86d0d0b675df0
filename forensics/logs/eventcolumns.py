"""Event dicts (as the scanner builds them) into typed columns, fast and exact.

During an abort storm a source holds tens of thousands of events. Reading them column by
column with ``event.get(name)`` and letting ``pd.array`` infer each list costs several
microseconds an event; here the keys every event has are read in one pass
(``operator.itemgetter``), integers go straight into numpy integer buffers with a mask
(never through float: rooms are 63-bit and more) and texts into object arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np
import pandas as pd

_NUMPY_INT = {"Int64": np.int64, "UInt64": np.uint64}
_INT_OR_NONE = {int, type(None)}
# The keys every event dict of the scanner holds (``SourceScanner._new_event``, ``_emit_block``).
EVERY_EVENT_KEY = ("_ts_kind", "_ts_value", "ts_source", "host", "unit", "source", "line", "signature", "severity",
                   "step", "room", "rid", "rank", "dp_rank", "pp_rank", "thread", "message", "raw", "offset")


def column_lists(events: Sequence[dict], names: Sequence[str], every: Sequence[str] = ()) -> dict[str, Sequence]:
    """``{name: [event.get(name) for event in events]}`` (lists or tuples) for every name, in few passes.

    ``every`` names the keys that each event holds: those are read together, one C pass.
    """
    columns: dict[str, Sequence] = {}
    every = [name for name in every if name in names]
    if every:
        try:
            rows = list(map(itemgetter(*every), events))
        except KeyError:  # an event without one of them: read every column the slow way
            pass
        else:
            if len(every) == 1:
                columns[every[0]] = rows
            else:
                columns.update(zip(every, zip(*rows)))  # tuples: read, never changed
    for name in names:
        if name not in columns:
            columns[name] = [event.get(name) for event in events]
    return columns


def int_array(values: Sequence, dtype: str) -> pd.api.extensions.ExtensionArray:
    """A nullable integer array (``Int64``, ``UInt64``) from Python ints and None, exactly."""
    numpy_type = _NUMPY_INT.get(dtype)
    if numpy_type is None or not set(map(type, values)) <= _INT_OR_NONE:
        return pd.array(list(values), dtype=dtype)  # anything unusual: pandas' own checks
    data = np.array(values, dtype=object)
    mask = np.equal(data, None)
    if mask.all():
        return pd.arrays.IntegerArray(np.zeros(len(values), dtype=numpy_type), mask)
    data[mask] = 0
    # object -> integer converts each Python int exactly (OverflowError if out of range).
    return pd.arrays.IntegerArray(data.astype(numpy_type), mask)


def text_array(values: Sequence) -> pd.api.extensions.ExtensionArray:
    """A ``string`` array from str and None."""
    return pd.array(np.array(values, dtype=object), dtype="string")
