"""The notebook workspace (notebooks/): pairs, parameters, and a headless run on the twin.

Fast: every ``notebooks/*.ipynb`` has its py:percent pair and they agree cell for cell (read with
jupytext), the ``.ipynb`` is committed without outputs, and every notebook has exactly one cell
tagged ``parameters`` (papermill).

Headless (in CI's default run, about 80 s): papermill executes each notebook (00-04) with the ``python3`` kernel (the project's
venv) against the twin, all writing into one output folder, and the test asserts on what they
saved, not on printed text: 01's ``verdict.json`` is WEDGED, 03's campaign is PASS (its unpatched control FAIL), 04 writes the
report in all three formats, 00's verdict is WEDGED, 02 saves the handler
gap and its sandbox confirmation (04 reads 01's and 03's results, so it runs them first when needed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
IPYNBS = sorted(NOTEBOOKS.glob("*.ipynb"))
PYS = sorted(p for p in NOTEBOOKS.glob("*.py"))

jupytext = pytest.importorskip("jupytext")


def _cells(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def _tagged(notebook, tag: str) -> list[int]:
    return [i for i, cell in enumerate(notebook.cells) if tag in cell.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    assert IPYNBS, "no notebooks/*.ipynb"


def test_every_notebook_has_its_pair():
    assert {p.stem for p in IPYNBS} == {p.stem for p in PYS}, "each .ipynb pairs with one py:percent .py"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_pair_agrees(ipynb: Path):
    py = ipynb.with_suffix(".py")
    assert py.is_file(), f"{ipynb.name} has no {py.name}"
    assert "format_name: percent" in py.read_text(), f"{py.name} is not py:percent"
    from_ipynb = jupytext.read(ipynb)
    from_py = jupytext.read(py)
    assert _cells(from_ipynb) == _cells(from_py), f"{ipynb.name} and {py.name} differ: run `jupytext --sync`"
    assert _tagged(from_ipynb, "parameters") == _tagged(from_py, "parameters")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_committed_without_outputs(ipynb: Path):
    raw = json.loads(ipynb.read_text())
    for cell in raw["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, ipynb.name


@pytest.mark.parametrize("path", IPYNBS + PYS, ids=lambda p: p.name)
def test_exactly_one_parameters_cell(path: Path):
    notebook = jupytext.read(path)
    tagged = _tagged(notebook, "parameters")
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged parameters"
    source = notebook.cells[tagged[0]].source
    for name in ("target", "release", "sessions", "cycles", "out"):
        assert f"{name} =" in source, f"{path.name}: parameter {name!r} missing"


# --- executed headless on the twin -------------------------------------------------------------

# CI-sized: notebook 02's release matrix over the releases around each boundary, not all of them
# (a fresh machine would otherwise download every 0.5.x wheel for this one table).
MATRIX_RELEASES = ["0.5.12.post1", "0.5.13", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.22", "0.5.23"]
CI_PARAMETERS = {"target": "twin", "release": "0.5.15", "sessions": 6, "cycles": 1, "releases": MATRIX_RELEASES}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run notebooks by prefix (once each) into one shared output folder; returns (out, run)."""
    papermill = pytest.importorskip("papermill")
    work = tmp_path_factory.mktemp("notebooks")
    out = work / "out"
    done: dict[str, float] = {}

    def run(prefix: str) -> float:
        if prefix not in done:
            (source,) = [p for p in IPYNBS if p.stem.startswith(prefix)]
            started = time.monotonic()
            papermill.execute_notebook(str(source), str(work / source.name), kernel_name="python3",
                                       parameters={**CI_PARAMETERS, "out": str(out)}, cwd=str(work),
                                       progress_bar=False)
            done[prefix] = time.monotonic() - started
            print(f"{source.name}: {done[prefix]:.1f} s")
        return done[prefix]

    return out, run


@pytest.mark.server
@pytest.mark.timeout(600)
def test_01_reproduces_the_wedge(executed):
    out, run = executed
    run("01")
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "WEDGED"
    assert json.loads((out / "baseline.json").read_text())["verdict"] == "HEALTHY"
    assert (out / "bundle" / "manifest.json").is_file()


@pytest.mark.server
@pytest.mark.timeout(600)
def test_03_validates_the_patched_engine(executed):
    out, run = executed
    run("03")
    campaign = json.loads((out / "campaign" / "campaign.json").read_text())
    assert campaign["campaign"] == "PASS"
    assert campaign["aborts"] >= 1
    control = json.loads((out / "campaign-unpatched" / "campaign.json").read_text())
    assert control["campaign"] == "FAIL"  # A/B: the unpatched control wedges under the same storm


@pytest.mark.server
@pytest.mark.timeout(900)
def test_04_writes_the_report(executed):
    out, run = executed
    run("01")
    run("03")
    run("04")
    for name in ("report.md", "report.html", "report.pdf"):
        assert (out / "report" / name).stat().st_size > 0, name
    assert "WEDGED" in (out / "report" / "report.md").read_text()


@pytest.mark.server
@pytest.mark.timeout(600)
def test_00_investigates_an_incident(executed):
    out, run = executed
    run("00")
    assert json.loads((out / "investigate-verdict.json").read_text())["verdict"] == "WEDGED"


@pytest.mark.server
@pytest.mark.timeout(600)
def test_02_finds_and_confirms_the_gap(executed):
    out, run = executed
    run("02")
    saved = json.loads((out / "handlers.json").read_text())
    assert any("ABORT" in line and "thread dies" in line for line in saved["headline"])
    assert saved["sandbox"]["alive"] is False
    assert saved["sandbox"]["rooms"]["2"] == "Bootstrapping"
    # the same killed client: the NIXL twin of 0.5.15 wedges, the Mooncake twin marks the room Failed
    nixl, mooncake = saved["same_kill"]["nixl"], saved["same_kill"]["mooncake"]
    assert nixl["abort_reached"] and nixl["wedged"] is True
    assert mooncake["abort_reached"] and mooncake["bootstrap_alive"] and mooncake["room_failed"]
    assert mooncake["completed"] and int(mooncake["room"]) < 2**63
