"""The README starts at the incident and stays short; every page it and the docs index name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "README.md"
MAX_BYTES = 10_240


def test_the_readme_fits_in_10_kb_and_its_first_80_lines_show_the_3_am_path():
    data = README.read_bytes()
    assert len(data) <= MAX_BYTES, f"README.md is {len(data)} bytes (at most {MAX_BYTES}): move detail to docs/"
    head = "\n".join(data.decode("utf-8").splitlines()[:80])
    for command in ("| forensics logs -", "forensics init ", "forensics diagnose "):
        assert command in head, f"{command!r} is not in the README's first 80 lines"


def test_every_page_the_readme_names_exists():
    text = README.read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:docs|benchmarks)/[\w./-]+\.md)", text))
    assert named, "the README names no page"
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, missing


def test_the_docs_index_links_every_page_and_only_pages_that_exist():
    text = INDEX.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert linked == pages, {"not linked": sorted(pages - linked), "no such page": sorted(linked - pages)}
