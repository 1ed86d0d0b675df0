"""Where downloaded sglang wheels and unpacked sources live (never inside the repo)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "PD_FORENSICS_CACHE"


def cache_dir() -> Path:
    """The root of PD Forensics' cache: ``$PD_FORENSICS_CACHE`` or the user cache dir."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        root = Path(configured).expanduser()
    else:
        from platformdirs import user_cache_dir

        root = Path(user_cache_dir("pd-forensics"))
    root.mkdir(parents=True, exist_ok=True)
    return root
