"""pull/push know the link: an estimate from the rate RNS measured while
setting the Link up, and a refusal (with the estimate) past the limit unless
forced. Over a real shaped link: tests/lab/test_lab_links.py."""

import pytest

from links.wire import Code, WireError
from reticulum_grid.store.sync import MAX_TRANSFER_S, SLOW_SETUP_BPS, check_duration, estimate_s


def test_estimate_on_a_radio_class_link():
    assert estimate_s(1_000_000, 2_000) == pytest.approx(4000.0)
    assert estimate_s(1_000_000, SLOW_SETUP_BPS) is None  # latency-bound set-up: says nothing of the rate
    assert estimate_s(1_000_000, None) is None


def test_too_long_is_refused_with_the_estimate_unless_forced():
    with pytest.raises(WireError) as e:
        check_duration(1_000_000, 2_000, "pull big")
    assert e.value.code == Code.TOO_SLOW
    assert "1.00 MB" in e.value.message and "2.0 kbit/s" in e.value.message and "67 min" in e.value.message
    assert "--force" in e.value.message
    assert check_duration(1_000_000, 2_000, "pull big", limit_s=None) == pytest.approx(4000.0)
    assert 400.0 == pytest.approx(check_duration(100_000, 2_000, "pull small")) and 400.0 < MAX_TRANSFER_S
