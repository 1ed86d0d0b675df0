"""The handler map's predictions checked on live Mooncake twins at the boundary releases.

As test_crosscheck.py does for NIXL: the release's own Mooncake loop, the real transfer engine
over TCP, the decode's own ABORT (from 0.5.13) and a foreign frame.
"""

from __future__ import annotations

import pytest
from crosscheck_helpers import BOUNDARY, assert_live_fates_agree

pytestmark = [pytest.mark.server]


# Mooncake before 0.5.10 too (the older wrapper and receiver; no ABORT from the decode before
# 0.5.13): 0.5.6 in CI (a few seconds: no kill needed), the ends of that range in the slow set.
OLD = [pytest.param("0.5.1", marks=pytest.mark.slow), "0.5.6", pytest.param("0.5.9", marks=pytest.mark.slow)]


@pytest.mark.parametrize("release", OLD + BOUNDARY)
@pytest.mark.timeout(300)
def test_the_live_mooncake_twin_does_what_the_map_predicts(release):
    assert_live_fates_agree(release, "mooncake")
