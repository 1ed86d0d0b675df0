"""Renamed metrics: a scraped name to its current (canonical) name, from one table, ``renames.toml``.

sglang renamed some series between releases (and misspelled one for two releases); the readers
compare series by canonical name, so a page of any release reads the same. A sample keeps its
suffix through a rename (``_total``, ``_bucket``, ...). Below the exposition parser and the
scraper, which both name samples by it.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path

# The suffixes a sample adds to its family's name (counters, histograms, summaries, gauge
# histograms, info), as the text exposition formats write them.
SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")

RENAMES_FILE = Path(__file__).with_name("renames.toml")


@lru_cache(maxsize=1)
def renames() -> dict[str, str]:
    """``{scraped name: canonical name}`` for every rename in ``renames.toml``."""
    table = tomllib.loads(RENAMES_FILE.read_text(encoding="utf-8"))
    mapping: dict[str, str] = {}
    for row in table.get("rename", []):
        canonical = row["canonical"]
        for name in row["names"]:
            if name in mapping and mapping[name] != canonical:
                raise ValueError(f"{RENAMES_FILE}: {name!r} renamed to both {mapping[name]!r} and {canonical!r}")
            mapping[name] = canonical
    return mapping


# sglang's model gateway (smg) re-exports each worker's page on its /engine_metrics with the
# colon of sglang's prefix turned into an underscore (``sglang_num_queue_reqs``): the same family.
GATEWAY_PREFIX = "sglang_"
ENGINE_PREFIX = "sglang:"


def canonical_name(name: str) -> str:
    """The current name of a sample name (a renamed family keeps its sample suffix; the gateway's
    ``sglang_`` spelling is the engine's ``sglang:``)."""
    if name.startswith(GATEWAY_PREFIX):
        name = ENGINE_PREFIX + name[len(GATEWAY_PREFIX):]
    table = renames()
    if name in table:
        return table[name]
    for suffix in SAMPLE_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in table:
            return table[name[: -len(suffix)]] + suffix
    return name
