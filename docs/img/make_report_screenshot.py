"""Make docs/img/report-page.png: the first screen of the postmortem `forensics demo` writes, in chromium.

    .venv/bin/python docs/img/make_report_screenshot.py [--demo DEMO_OUT] [DIR]

writes ``report-page.png`` into DIR (default: ``$PD_FORENSICS_SCREENSHOTS``, else this folder).
The report is a real one: that of the incident the demo reproduces on a twin (the wedge, its
diagnosis, the handler diff read from the release's source, the patched engine's validation).
``--demo`` names the folder of an earlier ``forensics demo --out DEMO_OUT``; without it the demo
runs first (about a minute). Debian's chromium is driven by Playwright (``executable_path``; it
cannot download a browser here).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.browser_helpers import chromium_executable, launch_chromium  # noqa: E402


def demo_report(demo_out: Path | None, work: Path) -> Path:
    """The demo's report.html: from ``demo_out`` when given, else from a fresh demo run in ``work``."""
    if demo_out is None:
        demo_out = work / "demo"
        subprocess.run([sys.executable, "-m", "forensics", "demo", "--out", str(demo_out)], check=True)
    page = demo_out / "report" / "report.html"
    if not page.is_file():
        raise SystemExit(f"{page}: no report there (run `forensics demo --out {demo_out}` first)")
    return page


def make(out_dir: Path, demo_out: Path | None = None) -> Path:
    executable = chromium_executable()
    if executable is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as work:
        page_file = demo_report(demo_out, Path(work))
        out_dir.mkdir(parents=True, exist_ok=True)
        png = out_dir / "report-page.png"
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright, executable)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
                page.goto(page_file.resolve().as_uri())
                page.screenshot(path=str(png))  # the first screen only: the title, facts and summary
            finally:
                browser.close()
    return png


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path,
                        default=Path(os.environ.get("PD_FORENSICS_SCREENSHOTS") or Path(__file__).resolve().parent))
    parser.add_argument("--demo", type=Path, default=None, help="the folder of an earlier `forensics demo --out`")
    args = parser.parse_args()
    print(make(args.out, args.demo))
