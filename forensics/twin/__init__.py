"""The twin: a real PD deployment (prefill, decode, router) on one CPU machine.

``with fx.twin.up("0.5.15") as twin: ...`` — see :mod:`forensics.twin.api`.
"""

from forensics.twin.api import Deployment, TwinError, attach, up

__all__ = ["Deployment", "TwinError", "attach", "up"]
