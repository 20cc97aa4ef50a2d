"""The busy-machine probe words a large spread as a multiple of the median ("8.3x the median
time", not "spread 832%"); the verdicts read the number, unchanged."""

from __future__ import annotations

import math

import pytest

from attn_dispatch.calibration.noise import (
    BUSY_SPREAD,
    SPREAD_AS_MULTIPLE,
    STOP_SPREAD,
    MachineBusy,
    Noise,
    check_quiet,
    probe_noise,
    spread_words,
)


@pytest.mark.parametrize(("spread", "words"), [
    (0.0, "0%"), (0.04, "4%"), (0.68, "68%"), (0.99, "99%"),
    (SPREAD_AS_MULTIPLE, "1.0x the median time"), (8.32, "8.3x the median time"),
    (math.inf, "not measurable (a zero median time)"),
])
def test_spread_words(spread, words):
    assert spread_words(spread) == words


def test_the_thresholds_stay_percentages_below_the_multiple_wording():
    assert BUSY_SPREAD < STOP_SPREAD < SPREAD_AS_MULTIPLE


def test_a_very_busy_probe_reads_as_a_multiple_and_still_stops():
    # quartiles 1.2 and 42.8 ms around a 5 ms median: an interquartile range 8.32x the median
    samples = [1e-3] * 3 + [1.2e-3] * 4 + [5e-3] + [40e-3] * 2 + [42.8e-3] * 2 + [50e-3] * 3
    noise = probe_noise("cpu", samples=samples, cpu_share=1.0)
    assert noise.spread == pytest.approx(8.32)
    assert noise.too_busy and noise.busy
    text = noise.describe()
    assert "spread 8.3x the median time (busy over 30%, stop over 50%)" in text
    assert "832%" not in text
    with pytest.raises(MachineBusy, match=r"spread 8\.3x the median time"):
        check_quiet(noise, allow_busy=False)


def test_an_ordinary_spread_keeps_its_percentage():
    assert "spread 68% (busy over 30%" in Noise(median_s=6.29e-3, spread=0.68).describe()
