"""`attn-dispatch show`: the summary in words and the decision-map PNG."""

from __future__ import annotations

import pytest

from attn_dispatch.models import save_table, store_table
from attn_dispatch.models.decision_plot import decision_panels, family_of
from tests.cli.tables import FAST, SLOW, honest_table

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_show_file_summary_and_plot(cli, tmp_path):
    path = save_table(honest_table(extra_class=True), tmp_path / "table.json")
    png = tmp_path / "maps" / "decision.png"
    code, out, _ = cli("show", path, "--plot", png)
    assert code == 0
    assert f"table: {path}" in out
    assert "card: " in out and "provenance: created 2026-11-30T00:00:00Z, fitted on 8 measured points" in out
    assert "held-out quality: on 8 problems the fit never saw: how often each way of choosing picked" in out
    assert "  its cost model alone: fastest on 75.0% (80.0% within measurement noise), 5.0% slower on average" in out
    assert "winning kernels: 2 kinds of problem (dtype, causality, mask) over 4 buckets" in out
    assert f"    - {FAST} everywhere in this class" in out
    assert f"plot of the winning kernels: {png}" in out
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_show_uses_this_devices_table(cli):
    stored = store_table(honest_table())
    code, out, _ = cli("show")
    assert code == 0 and f"table: {stored} (exact match" in out


def test_show_without_table_says_what_to_run(cli):
    code, out, err = cli("show")
    assert code == 2 and out == ""
    assert "no threshold table serves cpu" in err and "attn-dispatch calibrate" in err


@pytest.mark.parametrize("content", [b"", b"{not json", b"\x80\x04K\x01.", b'{"format_version": 99}'])
def test_show_rejects_bad_files(cli, tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    code, _, err = cli("show", bad)
    assert code == 2 and "attn-dispatch show: error:" in err and str(bad) in err


def test_decision_panels_speedup_over_default():
    table = honest_table()
    (panel,) = decision_panels(table)
    assert panel.winners == {(6, 8): FAST, (4, 7): FAST}
    assert panel.q_buckets == (4, 5, 6) and panel.kv_buckets == (7, 8)
    # no embedded model, sdpa_default not ranked: its time comes from the prior
    assert panel.source == "prior" and all(v is not None and v > 0 for v in panel.speedup.values())
    assert panel.grid(panel.speedup).shape == (3, 2)


def test_family_of():
    assert family_of(SLOW) == "chunked"
    assert family_of("convert[bf16->fp32]+small_q[splits=8]") == "convert+small_q"
    assert family_of("sdpa_flash") == "sdpa_flash"


def test_map_colours_hue_per_family_shade_per_variant_hatch_per_conversion():
    pytest.importorskip("matplotlib")
    import colorsys

    from attn_dispatch.models.decision_plot import convert_hatches, kernel_colours

    names = ["small_q[splits=1]", "small_q[splits=8]", "chunked[q=512,kv=4096]", "chunked[q=128,kv=1024]",
             "sdpa_default", "convert[fp16->fp32]+chunked[q=512,kv=4096]", "convert[bf16->fp32]+small_q[splits=8]",
             "convert[fp32->bf16]+small_q[splits=8]"]
    colours = kernel_colours(names)
    hues = {name: round(colorsys.rgb_to_hls(*colours[name][:3])[0], 3) for name in names}
    assert hues["small_q[splits=1]"] == hues["small_q[splits=8]"] != hues["chunked[q=512,kv=4096]"]
    assert hues["chunked[q=512,kv=4096]"] == hues["chunked[q=128,kv=1024]"]
    assert colours["small_q[splits=1]"] != colours["small_q[splits=8]"]
    assert len({colours[n] for n in names if not n.startswith("convert")}) == 5
    hatches = convert_hatches(names)
    assert set(hatches) == {n for n in names if n.startswith("convert")}
    assert len(set(hatches.values())) == 3
    assert colours["convert[fp16->fp32]+chunked[q=512,kv=4096]"] == colours["chunked[q=512,kv=4096]"]
