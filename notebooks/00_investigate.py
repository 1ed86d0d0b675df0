# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%

# %% [markdown]
# # 00 · Investigate
#
# Start from what you have: an evidence **bundle** (`forensics collect --out`), **log files**, or
# an **inventory** (`target`). With none of them (the default) the notebook makes an incident to
# look at: an unpatched twin and one abort storm. Then: the verdict, the timeline of events across
# prefill and decode, the queue gauges over time, health versus liveness, and the thread check
# with the missing thread highlighted.

# %% tags=["parameters"]
target = "twin"          # "twin", or the path of a live deployment's inventory file
release = "0.5.15"       # the sglang release the twin runs
sessions = 6             # storm sessions (twin only: to make an incident)
cycles = 1               # storm cycles (twin only)
out = "notebook-out"     # where the results are saved
bundle = None            # an evidence bundle folder: investigate it instead of collecting
logs = None              # log files or folders (a list): scanned on their own

# %%
import json
import pathlib

from IPython.display import SVG, display

import forensics as fx
from forensics.report import gauges_plot, probes_plot, timeline_plot

out = pathlib.Path(out)
out.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The evidence

# %%
twin = None
if bundle:
    evidence = fx.bundle.open(bundle)
elif target != "twin":
    evidence = fx.collect(target, since="30m", sample_s=8)
else:  # an incident to investigate: an unpatched twin, one storm
    twin = fx.twin.up(release, waiting_timeout=15, pool_pages=160,
                      prefill_rate_tps=400, decode_rate_tps=50, decode_log_interval=10)
    storm = fx.storm.run_storm(twin, sessions=sessions, cycles=cycles, prompt_tokens=1200,
                               max_tokens=16, phase="kv", kill_after=0, sample_s=4)
    evidence = storm.cycles[-1].evidence
evidence

# %% [markdown]
# ## The verdict

# %%
verdict = fx.diagnose(evidence)
(out / "investigate-verdict.json").write_text(json.dumps(verdict.to_dict(), indent=2, default=str))
verdict

# %% [markdown]
# ## Log files (when given)

# %%
if logs:
    scan = fx.logs.scan(list(logs), tz="UTC")
    print(scan.summary())
    display(scan.assess())

# %% [markdown]
# ## Timeline of events, prefill and decode

# %%
events = evidence.frame("events")
if events is not None and len(events):
    display(events[["ts", "role", "signature", "room", "message"]].sort_values("ts", kind="mergesort"))

# %%
svg = timeline_plot(events, None if events is None else events["ts"].min())
if svg:
    display(SVG(svg))

# %% [markdown]
# ## Queue gauges and health versus liveness

# %%
metrics, probes = evidence.frame("metrics"), evidence.frame("probes")
for svg in (gauges_plot(metrics, None if metrics is None else metrics["ts"].min()),
            probes_plot(probes, None if probes is None else probes["ts"].min())):
    if svg:
        display(SVG(svg))

# %% [markdown]
# ## Threads: the missing one highlighted

# %%
threads = evidence.frame("thread_check")
if threads is not None:
    shown = threads[["engine", "role", "pid", "logical_name", "expected", "found", "status", "source"]]
    display(shown.style.apply(lambda row: ["background: #fdd; font-weight: bold" if row["status"] == "missing"
                                           else "" for _ in row], axis=1))

# %% [markdown]
# ## Take the twin down (when this notebook started one)

# %%
if twin is not None:
    twin.down()
