"""``check``: capture the real engine and the twin of one release and compare them.

Each side is a :class:`~forensics.fidelity.capture.Capture` already taken (a stored real
capture, as the tests keep under ``tests/data/``), a :class:`~forensics.fidelity.capture.Target`
to capture now (from URLs or an inventory), or ``None``: the check starts that side itself
(:mod:`forensics.fidelity.deploy`) and takes it down after. The sides run one after the other,
never both at once: a real PD pair takes 4-5 GB.
"""

from __future__ import annotations

from pathlib import Path

from forensics.fidelity import deploy
from forensics.fidelity.capture import Capture, Target, capture_deployment
from forensics.fidelity.compare import FidelityReport, compare


def _words():
    from forensics.engine.model import prompt_words

    return prompt_words


def capture_side(kind: str, version: str, side: Capture | Target | str | Path | None, *,
                 raw_dir: str | Path | None = None) -> Capture:
    """One side's capture: as given, loaded from a file, captured from a target, or from a fresh deployment."""
    if isinstance(side, Capture):
        return side
    if isinstance(side, str | Path):
        path = Path(side)
        return Capture.load(path) if path.suffix == ".json" else capture_deployment(
            Target.from_inventory(path, name=kind), _words(), raw_dir=raw_dir)
    if isinstance(side, Target):
        return capture_deployment(side, _words(), raw_dir=raw_dir)
    starter = deploy.real_engine if kind == "real" else deploy.twin
    with starter(version) as target:
        return capture_deployment(target, _words(), raw_dir=raw_dir)


def check(version: str, *, real: Capture | Target | str | Path | None = None,
          twin: Capture | Target | str | Path | None = None, raw_dir: str | Path | None = None,
          save_real: str | Path | None = None) -> FidelityReport:
    """Every difference of the twin of ``version`` from the real engine of ``version``.

    ``raw_dir``: where each side's raw material goes (``raw_dir/real``, ``raw_dir/twin``).
    ``save_real``: write the real side's capture there (JSON), to compare later twins against.
    """
    raw = Path(raw_dir) if raw_dir is not None else None
    real_capture = capture_side("real", version, real, raw_dir=raw / "real" if raw else None)
    if save_real is not None:
        real_capture.save(save_real)
    twin_capture = capture_side("twin", version, twin, raw_dir=raw / "twin" if raw else None)
    return compare(real_capture, twin_capture)
