"""The handler map's predictions checked on live NIXL twins at the boundary releases.

For each release and backend: a twin, the decode's own ABORT (a client killed mid-transfer,
where the release's decode sends one) and a foreign frame at the prefill's bootstrap loop. The
live fate must be what the map predicts from the source; an undecided outcome fails the test
with its reason (a twin that cannot serve the release is a bug to fix, not a pass). Every
release, slowly: ``python -m benchmarks handler_crosscheck``. The Mooncake twins are in
test_crosscheck_mooncake.py (a file per worker under pytest-xdist: the two halves run side by side).
"""

from __future__ import annotations

import pytest
from crosscheck_helpers import BOUNDARY, assert_live_fates_agree

from forensics.crosscheck import DIED, NOT_SENT, SURVIVED, predict

pytestmark = [pytest.mark.server]


@pytest.mark.parametrize("release", BOUNDARY)
@pytest.mark.timeout(300)
def test_the_live_nixl_twin_does_what_the_map_predicts(release):
    assert_live_fates_agree(release, "nixl")


def test_the_predictions_follow_the_source_at_the_incident_boundaries():
    # Not read back from the code under test: what facts §4 says of these releases' NIXL loops.
    assert predict("0.5.12", "nixl") == (NOT_SENT, DIED)  # no ABORT sent yet; GUARD assert on foreign
    assert predict("0.5.15", "nixl") == (DIED, DIED)  # the incident
    assert predict("0.5.16", "nixl") == (SURVIVED, DIED)  # ABORT handled, foreign still fatal
    assert predict("0.5.15", "mooncake") == (SURVIVED, DIED)
    # Before 0.5.13 no decode sends ABORT; Mooncake's loop reads frame [3] of anything not "None".
    assert predict("0.5.6", "mooncake") == (NOT_SENT, DIED)
