"""What the cross-check tests share: the boundary releases and the assertion on a live twin."""

from __future__ import annotations

from forensics.crosscheck import cross_check

# Where a fate changes (0.5.12 sends no ABORT, 0.5.13 dies on it, 0.5.16 handles it, 0.5.23's
# KV_STATUS), the incident's last release and the releases between.
BOUNDARY = ["0.5.12", "0.5.13", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.20", "0.5.22", "0.5.23"]


def assert_live_fates_agree(release: str, backend: str) -> None:
    """A twin of ``release`` and ``backend`` takes the decode's ABORT and a foreign frame as the map
    predicts; an undecided outcome fails with its reason (a twin that cannot serve is a bug)."""
    checked = cross_check(release, backend, waiting_timeout=15)
    for name, probe in (("ABORT", checked.abort), ("foreign frame", checked.foreign)):
        assert probe.agrees is not None, f"{release} {backend} {name}: undecided: {probe.detail}"
        assert probe.agrees, (f"{release} {backend} {name}: the map predicts {probe.predicted}, the twin "
                              f"{probe.live} ({probe.detail})")
