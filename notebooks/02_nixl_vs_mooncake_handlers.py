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
# # 02 · NIXL versus Mooncake: the bootstrap loops side by side
#
# What each backend's prefill receiver loop does with each message tag, read from the release's own
# source; the gap highlighted; which releases carry it (the release matrix); and the static finding
# confirmed by running the release's real loop in the engine sandbox. Needs no deployment.

# %% tags=["parameters"]
target = "twin"          # (unused here: the handlers are read from the release's source)
release = "0.5.15"       # the sglang release to read
sessions = 6             # (unused here)
cycles = 1               # (unused here)
out = "notebook-out"     # where the results are saved
releases = None          # the release matrix's releases (a list); None: every 0.5.x release

# %%
import json
import pathlib

import matplotlib.pyplot as plt

import forensics as fx

out = pathlib.Path(out)
out.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The handler diff
# The findings first; each critical NIXL prefill finding replayed in the sandbox (`confirm=True`).

# %%
handler_diff = fx.handlers.diff(release, confirm=True)
print("\n".join(handler_diff.headline()))
handler_diff

# %% [markdown]
# ## Where the backends differ in a way that matters

# %%
table = handler_diff.to_frame()
table[table["gap"]]

# %% [markdown]
# ## The release matrix
# Every 0.5.x release × backend (the sglang sources are fetched once, then cached; the first time
# takes about a minute, with a progress bar).

# %%
matrix = fx.handlers.matrix(releases)
print("NIXL's loop dies on ABORT in:", matrix.window_text())
matrix

# %%
matrix.plot()
plt.show()

# %% [markdown]
# ## Confirmed in the sandbox
# The release's real prefill bootstrap loop, driven with frames built by its own decode code.

# %%
with fx.sandbox.EngineSandbox(fx.sglang_source.fetch(release)) as sb:
    sb.create_rooms([1, 2, 3, 4])                   # senders for rooms 1-4: Bootstrapping
    sb.send(sb.frames.registration())
    sb.send(sb.frames.transfer_info(room=1))
    sb.send(sb.frames.abort(room=2))                # the decode's ABORT
    sb.settle()
    alive, rooms, died_of = sb.thread_alive(), sb.room_state_names(), [e["message"] for e in sb.exceptions()]
print("bootstrap thread alive:", alive)
print("rooms:", rooms)
print("died of:", died_of[:1])

# %% [markdown]
# ## The same killed client on a NIXL twin and a Mooncake twin
# One streaming client killed while its KV transfer is pending, on a twin of this release for each
# backend (the release's own loops; Mooncake's real transfer engine over TCP). Where the map says
# NIXL has no ABORT case, its twin wedges; Mooncake's marks the room Failed and goes on.

# %%
import pandas as pd

kills = {backend: fx.demo.same_kill(release, backend) for backend in ("nixl", "mooncake")}
for backend, outcome in kills.items():
    print(f"{backend}: {outcome.sentence()}")
pd.DataFrame([outcome.to_dict() for outcome in kills.values()]).set_index("backend")

# %% [markdown]
# ## Save the results

# %%
(out / "handlers.json").write_text(json.dumps(
    {"release": release, "headline": handler_diff.headline(), "diff": handler_diff.to_dict(),
     "matrix": matrix.to_dict(), "same_kill": {backend: outcome.to_dict() for backend, outcome in kills.items()},
     "sandbox": {"alive": alive, "rooms": {str(k): v for k, v in rooms.items()},
                                             "died_of": died_of}}, indent=2, default=str))
sorted(p.name for p in out.iterdir())
