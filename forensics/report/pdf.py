"""The postmortem as PDF, through weasyprint, from the same HTML.

weasyprint needs Pango at run time (Debian: ``libpango-1.0-0 libpangoft2-1.0-0``); when it or
the Python package is missing, :func:`pdf_bytes` raises EnvironmentProblem (exit 4) naming it.
"""

from __future__ import annotations

import contextlib
import os

from forensics.exitcodes import EnvironmentProblem

APT_PACKAGES = "libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0"


def _weasyprint():
    try:
        import weasyprint
    except ImportError as exc:
        raise EnvironmentProblem(f"PDF needs the Python package weasyprint (pip install weasyprint): {exc}") from None
    except OSError as exc:  # the package is there, a shared library it loads is not
        raise EnvironmentProblem(f"PDF needs weasyprint's system libraries (apt-get install {APT_PACKAGES}): "
                                 f"{exc}") from None
    return weasyprint


PDF_IDENTIFIER = b"pd-forensics-report"


@contextlib.contextmanager
def _pinned_font_time():
    """fontTools stamps each embedded font subset with the time unless SOURCE_DATE_EPOCH is set."""
    before = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = before


def pdf_bytes(html: str) -> bytes:
    """The PDF of ``html`` (self-contained: no base URL, nothing fetched); the same HTML, the same bytes.

    No creation date is written, the document identifier is fixed, and the embedded font
    subsets carry a pinned time.
    """
    weasyprint = _weasyprint()
    with _pinned_font_time():
        return weasyprint.HTML(string=html, base_url=None).write_pdf(pdf_identifier=PDF_IDENTIFIER)


def pdf_text(html: str) -> str:
    """The text weasyprint lays out on the PDF's pages (page by page, box by box)."""
    weasyprint = _weasyprint()
    document = weasyprint.HTML(string=html, base_url=None).render()
    lines: list[str] = []

    def walk(box) -> None:
        text = getattr(box, "text", None)
        if isinstance(text, str):
            lines.append(text)
        for child in getattr(box, "children", ()) or ():
            walk(child)

    for number, page in enumerate(document.pages, 1):
        lines.append(f"\f[page {number}]")
        walk(page._page_box)
    return "\n".join(lines)
