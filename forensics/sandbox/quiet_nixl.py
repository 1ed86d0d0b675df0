"""NIXL agents whose progress thread sleeps between polls, so an idle twin is idle.

sglang creates its NIXL agents with the Python API's defaults: a progress thread
(``enable_prog_thread=True``) and, hard-coded in ``nixl_agent.__init__``, a progress-thread
delay (``pthrDelay``) of 0 µs. That thread then polls UCX without pause and holds a whole
core while nothing moves (measured here: 97-100% per agent). Without the thread, UCX's
notifications are never delivered to ``get_new_notifs`` (measured: a WRITE completes, its
notification never arrives), so the thread has to stay.

The fix is a delay: the same agent, built by the same Python API, with ``pthrDelay`` set
to ``PROGRESS_DELAY_US`` (5 ms). Measured on this CPU with two agents in one process at
1 ms: idle CPU 144% -> 1.3%, and a 1 MiB WRITE plus its notification 1.24 ms -> 0.14 ms
median (the busy threads were starving the work on two cores); on a whole idle twin, 5 ms
gave 2.6% of a core against 3.7% at 2 ms and 4.4% at 1 ms, with no slower control path
(``benchmarks/twin_idle.py``). ``$PD_FORENSICS_NIXL_PROGRESS_DELAY_US`` overrides it; ``0``
is sglang's own configuration (the benchmark measures both).
"""

from __future__ import annotations

import os
import threading

from forensics.sandbox.loopback import confine_ucx

PROGRESS_DELAY_US = 5000
DELAY_ENV = "PD_FORENSICS_NIXL_PROGRESS_DELAY_US"
_swap_lock = threading.Lock()  # the bindings are swapped module-wide while an agent is built


def progress_delay_us() -> int:
    """The progress-thread delay in µs: the environment's if set (0 = sglang's busy loop), else 1 ms."""
    text = os.environ.get(DELAY_ENV)
    if text is None or not text.strip():
        return PROGRESS_DELAY_US
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"${DELAY_ENV}={text!r}: not a number of microseconds") from None
    if value < 0:
        raise ValueError(f"${DELAY_ENV}={text!r}: negative")
    return value


class _DelayedBindings:
    """The NIXL bindings module, except that agents get ``pthrDelay = delay_us``.

    ``nixl_agent.__init__`` fills a ``nixlAgentConfig`` (forcing ``pthrDelay = 0``) and
    passes it to ``nixlBind.nixlAgent``; this stand-in sets the delay at that call and
    forwards everything else to the real module.
    """

    def __init__(self, real, delay_us: int) -> None:
        self._real = real
        self._delay_us = delay_us

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def nixlAgent(self, name, config):  # noqa: N802 - the bindings' own name
        config.pthrDelay = self._delay_us
        return self._real.nixlAgent(name, config)


def quiet_agent(api, name: str, config):
    """``api.nixl_agent(name, config)`` with a progress thread that sleeps ``progress_delay_us()`` between polls.

    ``api`` is the NIXL Python API module (``nixl_cu12._api``, or ``nixl._api`` as the
    sandbox aliases it).
    """
    confine_ucx()  # the agent's UCX listener on 127.0.0.1, not the first network interface
    delay = progress_delay_us()
    if delay == 0 or not hasattr(api, "nixlBind"):
        return api.nixl_agent(name, config)
    with _swap_lock:
        real = api.nixlBind
        api.nixlBind = _DelayedBindings(real, delay)
        try:
            return api.nixl_agent(name, config)
        finally:
            api.nixlBind = real
