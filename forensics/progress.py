"""Progress for long library calls: a bar in a notebook, silence in a script, or the caller's callback.

A call such as ``fx.handlers.matrix()`` can fetch and map dozens of releases (about a minute
the first time). Its ``progress`` argument is read by :func:`step_reporter`:

* ``None`` (the default): a tqdm bar when running under IPython or Jupyter, where someone is
  watching the cell; nothing from a plain script, whose stderr may be a log or a pipe;
* ``True``: a tqdm bar wherever it runs;
* ``False``: nothing;
* a callable: called with each finished step's name (a release number), nothing else shown.

The bar is ``tqdm.auto``'s (a widget in JupyterLab when ipywidgets is installed, text on stderr
otherwise). tqdm comes with the ``notebooks`` extra; without it there is no bar, never an error.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Step = Callable[[str], None]
Progress = bool | Step | None


def in_ipython() -> bool:
    """Whether this code runs under an IPython shell (a Jupyter kernel or the IPython prompt)."""
    ipython = sys.modules.get("IPython")  # never imported here: only a running shell has loaded it
    if ipython is None:
        return False
    get_ipython = getattr(ipython, "get_ipython", None)
    return get_ipython is not None and get_ipython() is not None


def _tqdm():
    """tqdm.auto's class, or None when tqdm is not installed."""
    try:
        with warnings.catch_warnings():
            # Without ipywidgets tqdm.auto warns and falls back to its text bar, which is what we want.
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


@contextmanager
def step_reporter(progress: Progress, total: int, what: str, unit: str = "step") -> Iterator[Step | None]:
    """The per-step callback ``progress`` asks for (see the module docstring), or None for silence.

    ``total`` is the number of steps, ``what`` names the work on the bar ("handlers matrix") and
    ``unit`` its steps ("release").
    A bar is closed when the block ends, finished or not.
    """
    if callable(progress):
        yield progress
        return
    show_bar = progress is True or (progress is None and in_ipython())
    bar_class = _tqdm() if show_bar else None
    if bar_class is None:
        yield None
        return
    bar = bar_class(total=total, desc=what, unit=unit)
    try:
        def step(name: str) -> None:
            bar.set_postfix_str(name, refresh=False)
            bar.update(1)

        yield step
    finally:
        bar.close()
