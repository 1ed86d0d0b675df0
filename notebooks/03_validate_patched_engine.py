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
# # 03 · Validate the patched engine
#
# The fix's diff, deployed to a fresh unpatched twin (or, with an inventory, to a live deployment:
# the plan first, and the deploy only with `confirm = True` in the parameters), then the validation campaign: storm cycles, each followed
# by four checks, every check with the evidence behind it; A/B against an unpatched control twin.

# %% tags=["parameters"]
target = "twin"          # "twin", or the path of a live deployment's inventory file
release = "0.5.15"       # the sglang release to patch
sessions = 6             # storm sessions per cycle
cycles = 1               # validation cycles
out = "notebook-out"     # where the results are saved
ab = True                # twin only: also storm a second, unpatched twin as the control (A/B)
confirm = False          # live only: True patches, restarts and storms the deployment (without it: the plan)

# %%
import pathlib
import shutil

from IPython.display import display

import forensics as fx
from forensics.validation import compare

out = pathlib.Path(out)
out.mkdir(parents=True, exist_ok=True)
live = target != "twin"

# %% [markdown]
# ## The patch
# The codemod's diff for review (applies with `patch -p1` under site-packages).

# %%
print(fx.patch.diff(release))

# %% [markdown]
# ## Deploy it
# A fresh, unpatched twin; then backup, write, compile check, restart, liveness.

# %%
if live:
    deployment = target
else:
    deployment = fx.twin.up(release, waiting_timeout=15, pool_pages=160,
                            prefill_rate_tps=400, decode_rate_tps=50, decode_log_interval=10)
print("before:", fx.patch.status(deployment).word)
record = fx.patch.deploy(deployment, yes=confirm)
if record.status == "planned":  # a live deployment without confirm: the plan, and nothing changed
    display(record)
    raise RuntimeError("shown the plan only: set confirm = True in the parameters cell to deploy the patch")
print(record.status, [step.name for step in record.steps])
print("after:", fx.patch.status(deployment).word)

# %% [markdown]
# ## The validation campaign, A/B
# The same campaign against the unpatched control (A, twin only) and then the patched engine (B).

# %%
control = fx.twin.up(release, waiting_timeout=15, pool_pages=160, prefill_rate_tps=400,
                     decode_rate_tps=50, decode_log_interval=10) if ab and not live else None
options = dict(yes=confirm, cycles=cycles, sessions=sessions, prompt_tokens=1200, max_tokens=16, phase="kv",
               kill_after=0, sample_s=4)
if control is not None:
    comparison = compare(control, deployment, **options)
    campaign = comparison.b
    print(comparison.summary())
    display(comparison)
else:
    campaign = fx.validate(deployment, **options)
print(campaign.summary())
campaign.to_frame()

# %% [markdown]
# ## Every check with its evidence

# %%
for check in campaign.checks:
    print(f"cycle {check.cycle} · {check.name}: {check.status} — {check.reason}")
    display(check.evidence.head(10))

# %% [markdown]
# ## Save the campaign (for notebook 04), and the control's

# %%
shutil.rmtree(out / "campaign", ignore_errors=True)
saved = campaign.save(out / "campaign")
print(campaign.status, "saved in", saved)
if control is not None:
    shutil.rmtree(out / "campaign-unpatched", ignore_errors=True)
    print(comparison.a.status, "(control) saved in", comparison.a.save(out / "campaign-unpatched"))

# %% [markdown]
# ## Take the twins down

# %%
if not live:
    deployment.down()
if control is not None:
    control.down()
