"""The postmortem report: an Investigation folder in, Markdown, HTML and PDF out (docs/report.md).

    import forensics as fx
    inv = fx.report.Investigation("incident-42", target="pd-prod-7", release="0.5.15")
    inv.add_bundle(evidence); inv.add_verdict(fx.diagnose(bundle=...))
    fx.report.write_report(inv, "incident-42/report", formats="md,html,pdf")

The report only reads the Investigation: it never collects, diagnoses a live deployment or
reads a clock, so the same folder always gives the same report.
"""

from __future__ import annotations

from .investigation import KINDS, MANIFEST, SCHEMA, Investigation, Part
from .pdf import pdf_text
from .plots import gauges_plot, probes_plot, timeline_plot
from .postmortem import Postmortem, build
from .writer import FORMATS, parse_formats, write_report

__all__ = ["FORMATS", "KINDS", "MANIFEST", "SCHEMA", "Investigation", "Part", "Postmortem", "build", "gauges_plot",
           "parse_formats", "pdf_text", "probes_plot", "timeline_plot", "write_report"]
