"""Batch lines (``Prefill batch, ...``, ``Decode batch, ...``) of one chunk into the batch store.

The scanner's part that turns sglang's per-batch log lines into rows: found by their literal,
grouped by layout (a line with its digits deleted changes only with the layout, host, unit and
rank letters), parsed in bulk per group; through the compiled ``_fastscan`` where it serves the
format. A mixin of :class:`forensics.logs.scanner.SourceScanner`, whose state it reads
(``fmt``, ``fast``, the learnt ``shapes`` and patterns, ``result``).
"""

from __future__ import annotations

import numpy as np

from forensics.logs import batchlines, timestamps
from forensics.logs.batchstore import MISSING
from forensics.logs.lineformats import as_text, lines_with, parse_ranks, split_line

BATCH_LITERAL = b" batch"
FAST_FORMATS = {"plain": 0, "short-iso": 1}  # formats whose batch lines _fastscan reads
TS_KIND = {"short-iso": timestamps.ISO, "short-precise": timestamps.PRECISE, "json": timestamps.EPOCH_US}


class BatchLineScan:
    """The batch-line methods of the scanner (see the module's docstring)."""

    def _batch_lines(self, data: bytes, consumed: set[int]) -> None:
        """Find every batch line, group lines of one layout, parse each group in bulk.

        In the text formats a line with its digits deleted is a key that only changes
        with the layout, the host, the unit and the rank letters: a handful of keys per
        deployment. Each key's lines are then parsed with one ``findall`` over their join,
        so the per-line Python work is a few C calls.
        """
        if self.fmt == "json":
            self._batch_lines_json(data, consumed)
            return
        if self.fast is not None:
            declined = self._batch_lines_fast(data, consumed)
            if declined:
                self._batch_line_groups(data[start:data.find(b"\n", start)] for start in declined
                                        if start not in consumed)
            return
        self._batch_line_groups(lines_with(data, BATCH_LITERAL, consumed))

    def _batch_line_groups(self, lines) -> None:
        groups: dict[bytes, list[bytes]] = {}
        delete = batchlines.SHAPE_DELETE
        for line in lines:
            key = line.translate(None, delete)
            bucket = groups.get(key)
            if bucket is None:
                bucket = groups[key] = []
            bucket.append(line)
        for key, lines in groups.items():
            shape = self._shape_of_key(key, lines)
            if shape is not None:
                self._add_batch_group(shape, lines)

    def _batch_lines_fast(self, data: bytes, consumed: set[int]) -> list[int]:
        """Batch lines through _fastscan; returns the starts of the lines it declined.

        Rows stay in file order (one store piece per chunk, every layout's columns
        NaN where a line did not print them), so the final frame rarely needs a sort.
        """
        (starts, layouts, times, dp, tp, pp, iters, value_starts, values, value_kinds, origins,
         declined) = self.fast.batch_lines(data, FAST_FORMATS[self.fmt], self.fast_layouts, self.fast_origins)
        declined = np.frombuffer(declined, dtype=np.int64).tolist()
        starts = np.frombuffer(starts, dtype=np.int64)
        if not len(starts):
            return declined
        self._learn_fast_keys()
        layouts = np.frombuffer(layouts, dtype=np.int32)
        value_starts = np.frombuffer(value_starts, dtype=np.int64)
        values = np.frombuffer(values, dtype=np.float64)
        value_kinds = np.frombuffer(value_kinds, dtype=np.uint8)
        keep = np.ones(len(starts), dtype=bool)
        if consumed:
            keep &= ~np.isin(starts, np.fromiter(consumed, dtype=np.int64, count=len(consumed)))
        # A True/False under a numeric label or a number under a boolean one reads
        # differently in the Python path: hand those lines back to it.
        present = np.unique(layouts)
        rows_of = {}
        for layout in present.tolist():
            shape = self.fast_shapes[layout]
            rows = np.flatnonzero(layouts == layout)
            cells = value_starts[rows, None] + np.arange(len(shape.columns))
            expected = np.array([name in batchlines.BOOL_SET for name in shape.columns], dtype=np.uint8)
            mismatched = (value_kinds[cells] != expected).any(axis=1)
            if mismatched.any():
                declined.extend(starts[rows[mismatched]].tolist())
                keep[rows[mismatched]] = False
            rows_of[layout] = (rows, cells)
        if not keep.all():
            index = np.cumsum(keep) - 1  # old row -> new row
            rows_of = {layout: (index[rows[keep[rows]]], cells[keep[rows]])
                       for layout, (rows, cells) in rows_of.items()}
            layouts, times, dp, tp, pp, iters, origins = (
                np.frombuffer(buffer, dtype=dtype)[keep] for buffer, dtype in (
                    (layouts, np.int32), (times, np.int64), (dp, np.int32), (tp, np.int32), (pp, np.int32),
                    (iters, np.int64), (origins, np.int32)))
        else:
            times, dp, tp, pp, iters, origins = (
                np.frombuffer(buffer, dtype=dtype) for buffer, dtype in (
                    (times, np.int64), (dp, np.int32), (tp, np.int32), (pp, np.int32), (iters, np.int64),
                    (origins, np.int32)))
        n = len(layouts)
        if n == 0:
            return declined
        numbers: dict[str, np.ndarray] = {}
        numbers_at = []  # each layout's fields at its rows' positions
        for layout, (rows, cells) in rows_of.items():
            if not len(rows):
                continue
            shape = self.fast_shapes[layout]
            columns = batchlines.columns_from_numbers(shape, values[cells])
            numbers_at.append((rows.astype(np.int32), columns))
        for name, ranks in (("dp_rank", dp), ("tp_rank", tp), ("pp_rank", pp), ("iter", iters)):
            # -1 from _fastscan: not printed (widen first: MISSING does not fit an int32)
            numbers[name] = np.where(ranks >= 0, ranks.astype(np.int64), MISSING)
        stamps = times.view("datetime64[ns]")
        if self.fmt == "plain" and self.tz != "UTC":
            stamps = timestamps.localise(stamps, self.tz).tz_localize(None).to_numpy()
        kinds = [shape.kind for shape in self.fast_shapes]
        coded = {"kind": (layouts, kinds)}
        if self.fmt != "plain":
            coded["host"] = (origins, [host for host, _ in self.fast_origin_names])
            coded["unit"] = (origins, [unit for _, unit in self.fast_origin_names])
        constants = {"ts_source": "sglang" if self.fmt == "plain" else "journal"}
        self.result.batches.add(n, stamps, numbers, constants, {}, coded=coded, numbers_at=numbers_at)
        seen = {kinds[layout] for layout in rows_of if len(rows_of[layout][0])}
        self.result.saw_prefill_batch |= "prefill" in seen
        self.result.saw_decode_batch |= "decode" in seen
        return declined

    def _learn_fast_keys(self) -> None:
        """Shapes and names for the layout and origin ids _fastscan added since the last chunk."""
        if len(self.fast_shapes) < len(self.fast_layouts):
            for key in list(self.fast_layouts)[len(self.fast_shapes):]:
                kind = b"Prefill" if key[:1] == b"P" else b"Decode"
                labels = tuple(key[1:-1].split(b"\0"))
                self.fast_shapes.append(batchlines.Shape(
                    kind=kind.decode().lower(), columns=tuple(batchlines.column_for(kind, label) for label in labels),
                    labels=labels))
        if len(self.fast_origin_names) < len(self.fast_origins):
            for key in list(self.fast_origins)[len(self.fast_origin_names):]:
                host, unit = key.split(b"\0", 1)
                self.fast_origin_names.append((as_text(host), as_text(unit)))

    def _shape_of_key(self, key: bytes, lines: list[bytes]) -> batchlines.Shape | None:
        """The layout of a group's lines, learnt from the first of them that reads as a batch line.

        Only found layouts are remembered: a damaged line that happens to come first
        must not hide the good lines of its key, in this chunk or a later one.
        """
        shape = self.shapes.get(key)
        if shape is None:
            kind_group = self.batch_re.groups - 1  # HEADER ends with (kind)(iter)
            for line in lines[:16]:
                found = self.batch_re.match(line)
                shape = batchlines.learn_shape(found.group(kind_group), line[found.end():]) if found else None
                if shape is not None:
                    self.shapes[key] = shape
                    break
        return shape

    def _add_batch_group(self, shape: batchlines.Shape, lines: list[bytes]) -> None:
        rows = self.batch_row_re.findall(b"\n".join(lines))
        if len(rows) != len(lines):
            # A line of this key that the full pattern rejects: parse them one by one.
            rows = [m.groups() for m in map(self.batch_row_re.match, lines) if m is not None]
        if not rows:
            return
        columns = list(zip(*rows))
        if self.fmt == "plain":
            ts, ranks, iters, fields = columns[0], columns[1], columns[3], columns[4]
            origins = None
        else:
            ts, ranks, iters, fields = columns[0], columns[5], columns[7], columns[8]
            origins = (columns[1], columns[2])
        self._emit_batch_frame(shape, TS_KIND.get(self.fmt, timestamps.SGLANG), ts, ranks, iters, fields, origins)

    def _batch_lines_json(self, data: bytes, consumed: set[int]) -> None:
        groups: dict[tuple, list] = {}
        position = data.find(BATCH_LITERAL)
        while position >= 0:
            start = data.rfind(b"\n", 0, position) + 1
            end = data.find(b"\n", position)
            position = data.find(BATCH_LITERAL, end)
            if start in consumed:
                continue
            split = split_line(data[start:end], "json")
            if split is None:
                continue
            found = self.batch_re.match(split.message)
            if found is None:
                continue
            kind = found.group(self.batch_re.groups - 1)
            fields = split.message[found.end():]
            key = (kind, fields.translate(None, batchlines.SHAPE_DELETE))
            groups.setdefault(key, []).append(
                (split.journal_ts, found.group(2) or b"", found.group(self.batch_re.groups), fields, split.host, split.unit))
        for (kind, _), rows in groups.items():
            shape = batchlines.learn_shape(kind, rows[0][3])
            if shape is None:
                continue
            ts, ranks, iters, fields, hosts, units = zip(*rows)
            self._emit_batch_frame(shape, timestamps.EPOCH_US, ts, ranks, iters, fields, (hosts, units))

    def _emit_batch_frame(self, shape, ts_kind, ts, ranks, iters, fields, origins) -> None:
        numbers = batchlines.number_table(shape, list(fields))
        if numbers is not None:
            columns = batchlines.columns_from_numbers(shape, numbers)
        else:
            values = batchlines.VALUES_IN_LINES.findall(b"\n".join(fields).replace(b"%", b"").replace(b"\r", b""))
            width = len(shape.columns)
            if len(values) != len(fields) * width:
                return  # cannot happen for lines of one key; refuse rather than misalign columns
            table = np.array(values, dtype=np.bytes_).reshape(len(fields), width)
            columns = batchlines.columns_from_table(shape, table)
        n = len(fields)
        stamps = timestamps.convert(ts_kind, ts, tz=self.tz, year=self.year).tz_convert("UTC").tz_localize(None)
        rank_cache: dict = {}
        for text in set(ranks):
            rank_cache[text] = tuple(MISSING if v is None else v for v in parse_ranks(text or b""))
        rank_rows = np.array([rank_cache[text] for text in ranks], dtype=np.int64).reshape(n, 3)
        # Iterations are exact integers (int() of the digits), never read through a float.
        iter_cache = {text: (int(text) if text else MISSING) for text in set(iters)}
        numbers_out = dict(columns)  # counters exact (float64 below 2**53, or int64), the rest float
        numbers_out["dp_rank"] = rank_rows[:, 0]
        numbers_out["tp_rank"] = rank_rows[:, 1]
        numbers_out["pp_rank"] = rank_rows[:, 2]
        numbers_out["iter"] = np.array([iter_cache[text] for text in iters], dtype=np.int64)
        per_row = {}
        if origins is not None:
            for name, raw in zip(("host", "unit"), origins):
                names = {value: as_text(value) for value in set(raw)}
                per_row[name] = [names[value] for value in raw]
        constants = {"kind": shape.kind, "ts_source": "sglang" if self.fmt == "plain" else "journal"}
        self.result.batches.add(n, stamps.to_numpy(), numbers_out, constants, per_row)
        if shape.kind == "prefill":
            self.result.saw_prefill_batch = True
        else:
            self.result.saw_decode_batch = True
