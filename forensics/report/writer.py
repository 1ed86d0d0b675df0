"""Write the postmortem of an Investigation as Markdown, HTML and PDF into one folder.

``OUT/report.md`` (plots beside it under ``OUT/plots/``), ``OUT/report.html`` (self-contained)
and ``OUT/report.pdf``. The same investigation gives byte-identical Markdown and HTML and a PDF
with the same text. Undecided (exit 3) when an input is missing, EnvironmentProblem (exit 4)
when the output cannot be written or weasyprint cannot run.
"""

from __future__ import annotations

import os
from pathlib import Path

from forensics.exitcodes import UsageProblem, environment_problem_from_os_error
from forensics.private_files import make_private_dir, write_private

from .investigation import Investigation

FORMATS = ("md", "html", "pdf")


def parse_formats(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"md,html"`` as ``("md", "html")`` in the canonical order; UsageProblem for an unknown one."""
    items = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    unknown = sorted(set(items) - set(FORMATS))
    if unknown or not items:
        raise UsageProblem(f"--format takes a comma-separated subset of {','.join(FORMATS)} (got {text!r})")
    return tuple(f for f in FORMATS if f in items)


def write_report(investigation: Investigation | str | os.PathLike[str], out: str | os.PathLike[str],
                 formats: str | tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """Write the report; returns each format's file.

    Example: ``fx.report.write_report("incident-42", "incident-42/report", formats="md,html")``
    """
    from . import html, markdown
    from .postmortem import build

    formats = parse_formats(formats)
    inv = investigation if isinstance(investigation, Investigation) else Investigation(investigation, create=False)
    pm = build(inv)
    out = Path(out)
    files: dict[str, bytes] = {}
    if "md" in formats:
        text, plots = markdown.render(pm)
        files["report.md"] = text.encode("utf-8")
        files.update({path: svg.encode("utf-8") for path, svg in sorted(plots.items())})
    page = html.render(pm) if ("html" in formats or "pdf" in formats) else None
    if "html" in formats:
        files["report.html"] = page.encode("utf-8")
    if "pdf" in formats:
        from .pdf import pdf_bytes

        files["report.pdf"] = pdf_bytes(page)
    written: dict[str, Path] = {}
    for name, data in files.items():
        path = out / name
        _write(path, data)
        for fmt in FORMATS:
            if name == f"report.{fmt}":
                written[fmt] = path
    return {fmt: written[fmt] for fmt in FORMATS if fmt in written}


def _write(path: Path, data: bytes) -> None:
    """0600 in 0700 folders: a postmortem quotes the deployment's evidence."""
    try:
        make_private_dir(path.parent)
        write_private(path, data)
    except OSError as exc:
        raise environment_problem_from_os_error(exc, str(path.parent if not path.parent.is_dir() else path),
                                                "cannot write the report") from None
