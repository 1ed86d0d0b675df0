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

# %% [markdown]
# # 01 · Reproduce the wedge
#
# Bring up the target (the twin by default, or a live deployment's inventory), take a healthy
# baseline, run the abort storm and watch the verdict flip to **WEDGED**. Logic lives in the
# library (`docs/API.md`); the cells only call it.

# %% tags=["parameters"]
target = "twin"          # "twin", or the path of a live deployment's inventory file
release = "0.5.15"       # the sglang release the twin runs (unpatched)
sessions = 6             # storm sessions per cycle
cycles = 1               # storm cycles
out = "notebook-out"     # where the results are saved
confirm = False          # live only: True storms the deployment (first run without it shows the plan)

# %%
import json
import pathlib

from IPython.display import SVG, display

import forensics as fx
from forensics.report.plots import probes_plot

out = pathlib.Path(out)
out.mkdir(parents=True, exist_ok=True)
live = target != "twin"

# %% [markdown]
# ## Bring up the target
# Small settings keep the storm short (slow prefill, a small decode KV pool).

# %%
if live:
    deployment = target
else:
    deployment = fx.twin.up(release, waiting_timeout=15, pool_pages=160,
                            prefill_rate_tps=400, decode_rate_tps=50, decode_log_interval=10)
    display(deployment.status())

# %% [markdown]
# ## Healthy baseline

# %%
baseline = fx.diagnose(fx.collect(deployment, since="5m", sample_s=2))
display(baseline)
print(baseline.verdict, baseline.reasons[:1])

# %% [markdown]
# ## The abort storm
# Streaming sessions through the router, their clients killed while they wait for KV. A storm can
# wedge a vulnerable engine: on a live deployment this cell shows the plan and stops unless the
# parameters say `confirm = True`.

# %%
storm_options = dict(sessions=sessions, cycles=cycles, prompt_tokens=1200, max_tokens=16, phase="kv",
                     kill_after=0, sample_s=4)
if live and not confirm:
    print(fx.storm.make_plan(deployment, **storm_options))
    raise RuntimeError("shown the plan only: set confirm = True in the parameters cell to storm the deployment")
storm = fx.storm.run_storm(deployment, yes=confirm, **storm_options)
print(storm.summary())
storm.history[["rid", "phase_at_kill", "phase_attributed"]]

# %% [markdown]
# ## The verdict flips

# %%
verdict = storm.verdicts[-1]
evidence = storm.cycles[-1].evidence
print(f"before the storm: {baseline.verdict}  ->  after: {verdict.verdict}")
display(verdict)

# %% [markdown]
# ## Health versus liveness
# `/health` keeps answering while the liveness probe (a real request) waits.

# %%
probes = evidence.frame("probes")
display(SVG(probes_plot(probes, probes["ts"].min())))

# %% [markdown]
# ## Save the results
# `verdict.json` and the evidence bundle, for notebook 04.

# %%
(out / "verdict.json").write_text(json.dumps(verdict.to_dict(), indent=2, default=str))
(out / "baseline.json").write_text(json.dumps(baseline.to_dict(), indent=2, default=str))
fx.bundle.write(evidence, out / "bundle")
sorted(p.name for p in out.iterdir())

# %% [markdown]
# ## Take the twin down

# %%
if not live:
    deployment.down()
