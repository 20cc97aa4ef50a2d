"""A calibration measured on a machine too busy to time kernels (``--allow-busy``) stores its table
with PyTorch's default serving outside measured buckets: its summary says that one thing. Before,
its warning said the held-out scores tell how the table compares, and those scores (the table's
model, its map, the prior) read as if they chose what serves, while the guard line said the
default does (a new user's trial, issue 15)."""

from __future__ import annotations

from pathlib import Path

from attn_dispatch.calibration.finish import TOO_BUSY_SCORES, fit_and_write
from attn_dispatch.calibration.noise import BUSY_SPREAD, STOP_SPREAD, Noise
from attn_dispatch.calibration.session import TOO_BUSY_STORED, CalibrationSummary
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.table_io import load_table
from tests.models.synthetic import synthetic_measurements

TOO_BUSY = Noise(median_s=2e-3, spread=STOP_SPREAD * 2)
BUSY = Noise(median_s=2e-3, spread=(BUSY_SPREAD + STOP_SPREAD) / 2)


def summary_of(tmp_path, monkeypatch, noise: Noise) -> tuple[list[str], object]:
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    identity = DeviceIdentity.cpu()
    points = synthetic_measurements(12, seed=7)
    summary = CalibrationSummary("test", identity, ("cpu",), Path(tmp_path / "results.jsonl"), "journal",
                                 measurements=points, noise_start=noise, noise_end=noise)
    summary.fit = fit_and_write(points, identity, out=None, seed=0, wall_s=1.0, too_busy=noise.too_busy)
    return "\n".join(summary.lines()).splitlines(), load_table(summary.fit.table_paths[0])


def test_a_too_busy_summary_says_what_serves_and_its_scores_chose_nothing(tmp_path, monkeypatch):
    lines, table = summary_of(tmp_path, monkeypatch, TOO_BUSY)
    assert table.verdict == "default"
    warnings = [line for line in lines if line.startswith("warning:") and "too busy" in line]
    assert warnings == [TOO_BUSY_STORED]
    assert "PyTorch's default serves inference calls" in TOO_BUSY_STORED
    assert not any("the held-out quality below says how the table compares" in line for line in lines)
    (held_out,) = [line for line in lines if line.startswith("held-out quality: ")]
    assert held_out.startswith(f"held-out quality: {TOO_BUSY_SCORES}on ")
    assert "the 'outside measured buckets' line says what does" in held_out
    guard = [line for line in lines if line.startswith("outside measured buckets: ")]
    assert guard and all(line.startswith("outside measured buckets: PyTorch's default serves") for line in guard)


def test_a_busy_but_not_too_busy_summary_lets_the_scores_decide(tmp_path, monkeypatch):
    lines, _ = summary_of(tmp_path, monkeypatch, BUSY)
    text = "\n".join(lines)
    assert "the held-out quality below says how the table compares" in text
    assert TOO_BUSY_STORED not in text and TOO_BUSY_SCORES not in text


def test_the_probes_before_and_after_give_their_spreads_in_one_unit():
    """A new user read "spread 2.0x the median time (busy over 0.3x ...)" before and "spread 0% (busy over 30% ...)"
    after in one summary; both lines now use the unit the wider spread needs."""
    summary = CalibrationSummary("test", DeviceIdentity.cpu(), ("cpu",), Path("results.jsonl"), "journal",
                                 noise_start=Noise(median_s=1e-3, spread=2.0), noise_end=Noise(median_s=6e-2, spread=0.004))
    before, after = summary.noise_lines()[:2]
    assert "spread 2.0x the median time (busy over 0.3x, stop over 0.5x)" in before
    assert "spread 0.0x the median time (busy over 0.3x, stop over 0.5x)" in after
