"""A device with no table measured on its card says so once per process: what is happening, and
what `attn-dispatch calibrate` would add and how long it takes (`dispatcher.device_ranking`);
`explain` and `attn-dispatch devices` say the same."""

from __future__ import annotations

import logging

import pytest

from attn_dispatch.dispatcher import Dispatcher, cold_path
from attn_dispatch.dispatcher import device_ranking as no_table_notice
from attn_dispatch.dispatcher.cli import main
from attn_dispatch.dispatcher.decision import RankingSource
from attn_dispatch.dispatcher.device_ranking import DeviceRanking
from tests.dispatcher.helpers import PRIOR_SOURCE, TEST_SOURCE, FixedRanker, qkv

pytestmark = pytest.mark.measuring


def _ranked_at(monkeypatch, source: RankingSource) -> None:
    def resolve(device, *, home=None):
        return DeviceRanking(table=None, prior=FixedRanker(["sdpa_default", "math"]), source=source,
                             prior_source=PRIOR_SOURCE)

    monkeypatch.setattr(cold_path, "resolve_ranking", resolve)
    monkeypatch.setattr(no_table_notice, "_said", set())


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no table measured on this card" in r.getMessage()]


def test_a_device_without_a_table_says_it_once(monkeypatch, caplog):
    _ranked_at(monkeypatch, PRIOR_SOURCE)
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"):
        first = Dispatcher(kernels=["sdpa_default", "math"])
        first.attention(**qkv())
        first.attention(**qkv(q_len=100, kv_len=100))  # another bucket
        Dispatcher(kernels=["sdpa_default", "math"]).attention(**qkv())  # another dispatcher, same device
    (line,) = _lines(caplog)
    assert "measured" in line and "PyTorch's default first" in line
    assert "attn-dispatch calibrate" in line and "minutes" in line
    assert any(note == no_table_notice.no_table_line("prior", "cpu", measure=True)
               for note in first.explain(**qkv()).notes)


def test_a_device_with_its_own_table_says_nothing(monkeypatch, caplog):
    _ranked_at(monkeypatch, TEST_SOURCE)
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"):
        Dispatcher(kernels=["sdpa_default", "math"]).attention(**qkv())
    assert _lines(caplog) == []


def test_a_family_stand_in_says_whose_table_ranks_and_measuring_off_says_so():
    family = no_table_notice.no_table_line("family", "cuda:0", measure=True)
    assert "another card's table of its family" in family
    off = no_table_notice.no_table_line("prior", "cuda:0", measure=False)
    assert "ATTN_DISPATCH_MEASURE=0" in off and "calibrate" in off
    assert no_table_notice.no_table_line("model", "cuda:0", measure=True) is None


def test_devices_says_it_too(capsys):
    assert main(["devices"]) == 0
    assert "no table measured on this card for cpu" in capsys.readouterr().out
