"""The report's content as plain blocks, so Markdown and HTML render the same facts.

A :class:`Section` holds blocks: a paragraph, a bullet or numbered list, a table, a plot, or a
placeholder for a person (clearly marked, pre-filled only with facts the evidence backs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLACEHOLDER_MARK = "TO BE WRITTEN BY A PERSON"


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Sub:
    """A sub-heading inside a section."""

    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    numbered: bool = False


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


@dataclass(frozen=True)
class Plot:
    name: str
    caption: str
    svg: str


@dataclass(frozen=True)
class Placeholder:
    """Something only a person can write; ``facts`` are what the evidence backs, to start from."""

    prompt: str
    facts: tuple[str, ...] = ()


Block = Para | Sub | Bullets | Table | Plot | Placeholder


@dataclass
class Section:
    key: str  # stable anchor, e.g. "root-cause"
    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2
