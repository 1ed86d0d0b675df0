"""Notebook 02 in a real JupyterLab, in headless chromium: what a user sees, not what papermill saves.

A copy of notebooks/02_nixl_vs_mooncake_handlers.ipynb (its ``out`` parameter pointed into the tmp
folder) is opened in a JupyterLab server started for this test, run with JupyterLab's own "run all
cells" command, and once every cell has its execution count the rendered DOM is checked: no cell
shows a traceback, the handler diff's ABORT finding is visible on screen, and the source excerpts
in the diff's table are left-aligned (JupyterLab's table CSS right-aligns cells, which once made
the code unreadable).

It skips only when playwright or Debian's chromium is missing; ``./run test`` installs both.

Screenshots for the README: with ``PD_FORENSICS_SCREENSHOTS=<dir>`` this test also saves
``jupyterlab-handlers.png`` there. The other one, ``report-page.png`` (the first screen of a
rendered postmortem report), is made by ``docs/img/make_report_screenshot.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.browser_helpers import jupyterlab, launch_chromium, require_browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "02_nixl_vs_mooncake_handlers.ipynb"
RELEASE = "0.5.15"
MATRIX_RELEASES = ["0.5.12.post1", "0.5.13", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.22", "0.5.23"]  # CI-sized
ABORT_FINDING = "the decode sends ABORT, the NIXL prefill loop has no case for it: thread dies"
SCREENSHOTS_ENV = "PD_FORENSICS_SCREENSHOTS"
# Notebook 02 runs CI-sized (MATRIX_RELEASES); on a fresh machine its first run still downloads those wheels.
RUN_ALL_DEADLINE_MS = 600_000
APP_DEADLINE_MS = 120_000
LEFT = {"left", "start"}

# The notebook's panel in the main area (the current widget follows focus, which a headless page lacks).
FIND_PANEL = """(name) => {
  const app = window.jupyterapp;
  if (!app) { return null; }
  for (const widget of app.shell.widgets('main')) {
    if (widget.context && widget.context.path.endsWith(name)) { return widget; }
  }
  return null;
}"""

NOTEBOOK_OPEN = f"(name) => ({FIND_PANEL})(name) !== null"

RUN_ALL = f"""async (name) => {{
  const app = window.jupyterapp;
  const panel = ({FIND_PANEL})(name);
  await panel.context.ready;
  await panel.sessionContext.ready;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  if (!kernel) {{ throw new Error('the notebook has no kernel'); }}
  app.shell.activateById(panel.id);  // run-all-cells acts on the active notebook
  void app.commands.execute('notebook:run-all-cells');  // not awaited: Python waits on the DOM
  return kernel.name;
}}"""

# The execution prompts ("[3]:", "[*]:") of the code cells that have code: JupyterLab runs no empty cell.
PROMPTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]
  .filter(cell => cell.querySelector('.jp-InputArea-editor').textContent.trim() !== '')
  .map(cell => cell.querySelector('.jp-InputArea-prompt').textContent.trim())"""

# Done: every such cell has its execution count; or stopped: nothing queued and a traceback shown.
RUN_FINISHED = f"""() => {{
  const prompts = ({PROMPTS})();
  if (prompts.length === 0 || prompts.some(p => p.includes('*'))) {{ return false; }}
  const errors = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .filter(e => e.textContent.includes('Traceback'));
  if (errors.length > 0) {{ return 'error'; }}
  return prompts.every(p => /^\\[\\d+\\]:$/.test(p)) ? 'done' : false;
}}"""

# How an excerpt renders: its cell's and its own computed text-align, and how far right of the
# excerpt's left content edge its first character is drawn (right-aligned, a short line starts far right).
EXCERPT_ALIGNMENT = """pre => {
  const td = pre.closest('td');
  const style = getComputedStyle(pre);
  const left = pre.getBoundingClientRect().left + pre.clientLeft + parseFloat(style.paddingLeft);
  const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  let text = walker.nextNode();
  while (text && text.data.length === 0) { text = walker.nextNode(); }
  let offset = 0;
  if (text) {
    const range = document.createRange();
    range.setStart(text, 0);
    range.setEnd(text, 1);
    offset = range.getBoundingClientRect().left - left;
  }
  return {td: getComputedStyle(td).textAlign, pre: style.textAlign, offset: offset,
          firstLine: pre.textContent.split('\\n')[0]};
}"""


def _copy_with_parameters(folder: Path, out: Path) -> Path:
    """The committed notebook copied, its parameters cell set to this release and a tmp ``out``."""
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in notebook.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    source = cell.source
    for name, value in (("release", RELEASE), ("out", str(out)), ("releases", MATRIX_RELEASES)):
        source, found = re.subn(rf"(?m)^{name} = .*$", f"{name} = {value!r}", source)
        assert found == 1, f"the parameters cell has {found} `{name} =` lines"
    cell.source = source
    copy = folder / NOTEBOOK.name
    nbformat.write(notebook, copy)
    return copy


@pytest.mark.server
@pytest.mark.timeout(900)
def test_notebook_02_renders_its_findings_and_left_aligned_code_in_jupyterlab(tmp_path):
    chromium = require_browser()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    served = tmp_path / "notebooks"
    served.mkdir()
    out = tmp_path / "out"
    notebook = _copy_with_parameters(served, out)

    with jupyterlab(served, tmp_path / "lab") as lab, sync_playwright() as playwright:
        browser = launch_chromium(playwright, chromium)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
            page.goto(lab.url(f"/lab/tree/{notebook.name}"), timeout=APP_DEADLINE_MS)
            page.wait_for_function(NOTEBOOK_OPEN, arg=notebook.name, timeout=APP_DEADLINE_MS)
            kernel = page.evaluate(RUN_ALL, notebook.name)
            assert kernel == "python3", kernel
            try:
                finished = page.wait_for_function(RUN_FINISHED, timeout=RUN_ALL_DEADLINE_MS).json_value()
            except PlaywrightTimeout as exc:
                raise AssertionError(f"the notebook did not finish within {RUN_ALL_DEADLINE_MS // 1000} s; "
                                     f"prompts {page.evaluate(PROMPTS)}\n{lab.log_tail()}") from exc

            # (c) no cell shows an error: a traceback in any output, stderr or not.
            outputs = page.locator(".jp-Notebook .jp-OutputArea-output")
            tracebacks = [text[:2000] for text in outputs.filter(has_text="Traceback").all_inner_texts()]
            assert not tracebacks, "a cell failed:\n" + "\n---\n".join(tracebacks)
            assert finished == "done", page.evaluate(PROMPTS)

            # (a) the handler diff's ABORT finding is on screen, in its rendered HTML (not the printed text).
            html_outputs = page.locator('.jp-Notebook .jp-OutputArea-output[data-mime-type="text/html"]')
            diff_output = html_outputs.filter(has_text=ABORT_FINDING).first
            finding = diff_output.get_by_text(ABORT_FINDING).first
            expect(finding).to_be_visible()
            finding.scroll_into_view_if_needed()  # JupyterLab left the window at the last cell it ran
            expect(finding).to_be_in_viewport()
            expect(diff_output.locator("table")).to_be_visible()

            # (b) the source excerpts in the diff's table are left-aligned, as computed and as drawn.
            excerpts = diff_output.locator("table td pre")
            assert excerpts.count() >= 2, "the diff's table shows no source excerpts"
            excerpts.first.scroll_into_view_if_needed()
            expect(excerpts.first).to_be_visible()
            misaligned = []
            for index in range(excerpts.count()):
                seen = excerpts.nth(index).evaluate(EXCERPT_ALIGNMENT)
                if seen["td"] not in LEFT or seen["pre"] not in LEFT or abs(seen["offset"]) > 2:
                    misaligned.append(f"excerpt {index} ({seen['firstLine']!r}): td text-align {seen['td']}, "
                                      f"pre text-align {seen['pre']}, its first character drawn "
                                      f"{seen['offset']:.0f} px right of the left edge")
            assert not misaligned, "code is not left-aligned (selector 'table td pre'):\n" + "\n".join(misaligned)

            screenshots = os.environ.get(SCREENSHOTS_ENV)
            if screenshots:
                _save_screenshot(page, finding, Path(screenshots) / "jupyterlab-handlers.png")
        finally:
            browser.close()

    saved = json.loads((out / "handlers.json").read_text())  # the last cell ran, in this kernel
    assert any(line.startswith(ABORT_FINDING) for line in saved["headline"]), saved["headline"]


def _save_screenshot(page, finding, path: Path) -> None:
    """The handler diff cell at the top of the window, the file browser folded away for room."""
    page.evaluate("""async () => {
      const app = window.jupyterapp;
      if (!app.shell.leftCollapsed) { await app.commands.execute('application:toggle-left-area'); }
    }""")
    finding.evaluate("e => e.closest('.jp-Cell').scrollIntoView({block: 'start'})")
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
