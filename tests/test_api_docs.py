"""docs/API.md runs: every ```python block, in order, in one namespace (as a reader would type them).

A block preceded by ``<!-- starts: twin -->`` starts the twin the later ``<!-- needs: twin -->``
blocks share (one 0.5.15 twin for the module, taken down at the end whatever happened). Blocks
may use ``tmp``, a scratch folder. One test per block, so a failure names its section; a block
whose predecessor failed is skipped rather than failing for the wrong reason.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "API.md"
FENCE = re.compile(r"(?:<!--\s*(?P<marker>[a-z]+:\s*[a-z]+)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)
MARKERS = {"starts: twin", "needs: twin"}


@dataclass
class Block:
    index: int
    line: int
    section: str
    marker: str | None
    code: str

    @property
    def twin(self) -> bool:
        return self.marker is not None

    @property
    def starts_server(self) -> bool:
        # The twin's blocks, and those that run a release's bootstrap loop in a sandbox engine
        # (a child process serving sglang's bootstrap socket), stay out of the fast lane.
        return self.twin or any(call in self.code for call in ("EngineSandbox(", "patch.verify("))


def blocks(text: str) -> list[Block]:
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("code"))  # the fence's line (1-based)
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
        marker = re.sub(r"\s+", " ", match["marker"]) if match["marker"] else None
        if marker is not None and marker not in MARKERS:
            raise ValueError(f"docs/API.md:{line}: unknown marker {marker!r} (known: {sorted(MARKERS)})")
        found.append(Block(len(found), line, headings[-1] if headings else "top", marker, match["code"]))
    return found


BLOCKS = blocks(DOC.read_text(encoding="utf-8"))


def test_the_page_has_examples_and_one_twin():
    assert len(BLOCKS) >= 8
    starts = [b for b in BLOCKS if b.marker == "starts: twin"]
    assert len(starts) == 1, "exactly one block starts the twin"
    assert all(b.index > starts[0].index for b in BLOCKS if b.marker == "needs: twin")
    text = DOC.read_text(encoding="utf-8")
    for entry in ("fx.logs", "fx.handlers", "fx.sandbox", "fx.patch.diff", "fx.patch.verify", "fx.patch.apply",
                  "fx.patch.deploy", "fx.twin.up", "fx.collect", "fx.diagnose", "fx.storm.run_storm", "fx.validate"):
        assert any(entry in b.code for b in BLOCKS), f"no example runs {entry}"
        assert entry in text


class Session:
    """The reader's Python session: one namespace, the blocks run so far, the twin once started."""

    def __init__(self, tmp: Path) -> None:
        self.namespace: dict = {"__name__": "api_docs", "tmp": tmp}
        self.ran: dict[int, str] = {}  # index -> "ok" or the failure

    def run_through(self, block: Block, leak_guard) -> None:
        for earlier in BLOCKS[: block.index]:  # a block selected alone (-k) still gets its predecessors
            if earlier.index not in self.ran:
                self._run(earlier, leak_guard)
            if self.ran[earlier.index] != "ok":
                pytest.skip(f"an earlier block failed (docs/API.md:{earlier.line}, {earlier.section})")
        self._run(block, leak_guard)
        if self.ran[block.index] != "ok":
            raise self.error

    def _run(self, block: Block, leak_guard) -> None:
        started = time.monotonic()
        code = compile(block.code, f"docs/API.md:{block.line}", "exec")
        try:
            exec(code, self.namespace)
        except BaseException as exc:
            self.ran[block.index] = f"{type(exc).__name__}: {exc}"
            self.error = exc
        else:
            self.ran[block.index] = "ok"
        finally:
            self._allow_twin(leak_guard)
            print(f"docs/API.md:{block.line} ({block.section}): {time.monotonic() - started:.1f} s")

    def _allow_twin(self, leak_guard) -> None:
        twin = self.namespace.get("twin")
        if twin is None or not Path(twin.inventory_path).is_file():  # none yet, or taken down (folder removed)
            return
        for role in ("prefill", "decode", "router"):  # a deploy restarts the prefill: a new pid
            pid = twin.pid(role)
            if pid is not None:
                leak_guard.allow(pid)

    def close(self) -> None:
        twin = self.namespace.get("twin")
        if twin is not None and Path(twin.inventory_path).is_file():  # still up: a block failed before down()
            twin.take_down()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    session = Session(tmp_path_factory.mktemp("api-docs"))
    yield session
    session.close()


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=f"{b.index:02d}-{re.sub(r'[^a-z0-9]+', '-', b.section.lower()).strip('-')}",
                  marks=[pytest.mark.server, pytest.mark.timeout(240)] if b.starts_server else [pytest.mark.timeout(120)])
     for b in BLOCKS],
)
def test_example_runs(block, session, leak_guard):
    session.run_through(block, leak_guard)
