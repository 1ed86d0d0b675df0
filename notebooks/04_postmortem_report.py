# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---


# %% [markdown]
# # 04 · The postmortem report
#
# Assemble the investigation from what notebooks 01 and 03 saved in `out` (the evidence bundle,
# the verdict, the campaign when there is one), add the release's handler diff, and write the
# postmortem as Markdown, HTML and PDF (`docs/report.md`).

# %% tags=["parameters"]
target = "twin"          # "twin", or the path of a live deployment's inventory file
release = "0.5.15"       # the sglang release investigated
sessions = 6             # (unused here: kept so every notebook takes the same parameters)
cycles = 1               # (unused here)
out = "notebook-out"     # where notebooks 01 and 03 saved their results; the report goes here too

# %%
import json
import pathlib

from IPython.display import HTML, display

import forensics as fx
from forensics.report import Investigation, write_report

out = pathlib.Path(out)

# %% [markdown]
# ## Build the investigation

# %%
inv = Investigation(out / "investigation", target=target, release=release, backend="nixl")
inv.add_bundle(out / "bundle")
inv.add_verdict(json.loads((out / "verdict.json").read_text()))
inv.add_handler_diff(fx.handlers.diff(release))
if (out / "campaign" / "campaign.json").is_file():
    inv.add_campaign(out / "campaign")
print("missing parts:", inv.missing() or "none")
sorted(inv.verdicts()), sorted(inv.campaigns()), sorted(inv.handler_diffs())

# %% [markdown]
# ## Write the report

# %%
written = write_report(inv, out / "report", formats="md,html,pdf")
{fmt: str(path) for fmt, path in written.items()}

# %% [markdown]
# ## The report

# %%
display(HTML(written["html"].read_text()))
