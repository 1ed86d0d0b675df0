"""The handler map's predictions checked on live Mooncake twins at the boundary releases.

As test_crosscheck.py does for NIXL: the release's own Mooncake loop, the real transfer engine
over TCP, the decode's own ABORT (from 0.5.13) and a foreign frame.
"""

from __future__ import annotations

import pytest
from crosscheck_helpers import BOUNDARY, assert_live_fates_agree

pytestmark = [pytest.mark.server]


@pytest.mark.parametrize("release", BOUNDARY)
@pytest.mark.timeout(300)
def test_the_live_mooncake_twin_does_what_the_map_predicts(release):
    assert_live_fates_agree(release, "mooncake")
