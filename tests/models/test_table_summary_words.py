"""The held-out comparison in words (`models.table_summary`, `models.quality.Guard.describe`): every
way of choosing gets the same two numbers, named plainly, and the verdict line says it weighs the
average slowdown, not how often a pick is the fastest (a new user read "always PyTorch's default:
top-1 62.5%" beside the table's "50.0%" and a verdict for the table as a contradiction)."""

from __future__ import annotations

from dataclasses import replace

from attn_dispatch.models.quality import ChoiceQuality, Guard, Quality, decide_verdict
from attn_dispatch.models.table_summary import held_out_lines


def _choice(top1: float, mean: float, n: int = 8) -> ChoiceQuality:
    return ChoiceQuality(top1, top1, mean, 3 * mean, 0.5, n, mean)


# The new user's case: PyTorch's default is the fastest more often than the table's picks, but
# where it is not, it is far slower; the prior is rarely the fastest.
TABLE, PRIOR, DEFAULT = _choice(0.5, 0.12), _choice(0.143, 0.43), _choice(0.625, 1.73)


def _quality(**changes) -> Quality:
    verdict = decide_verdict(TABLE, PRIOR, DEFAULT)
    quality = Quality(model=_choice(0.5, 0.27), prior=PRIOR, n_points_fit=456, n_problems_fit=32, n_points_test=120,
                      n_problems_test=8, holdout_fraction=0.2, seed=0, description="test model", table=_choice(0.5, 0.27),
                      default=DEFAULT, guarded=TABLE, verdict=verdict.describe())
    return replace(quality, **changes)


def test_each_way_of_choosing_gets_the_same_two_numbers_in_words():
    header, *rows = held_out_lines(_quality().to_dict())
    assert header == ("on 8 problems the fit never saw (fit on 456 points of 32 problems): how often each way of "
                      "choosing picked the fastest kernel, and how much slower than the fastest its picks ran")
    assert rows == [
        "  the table as stored (what the dispatcher uses): fastest on 50.0%, 12.0% slower on average, 36.0% at worst",
        "  always PyTorch's default: fastest on 62.5%, 2.73x the fastest's time on average",
        "  the analytic prior alone (a spec-sheet estimate): fastest on 14.3%, 43.0% slower on average",
        "  the table with its model everywhere: fastest on 50.0%, 27.0% slower on average",
        "  its cost model alone: fastest on 50.0% (50.0% within measurement noise), 27.0% slower on average, "
        "81.0% at worst; rank correlation 0.50",
    ]
    assert not any("top-1" in line for line in (header, *rows))


def test_the_summary_ends_with_the_verdict_and_what_decides_it():
    lines = _quality().summary().splitlines()
    assert lines[-1] == (
        "outside measured buckets: the table's model chooses (held-out mean slowdown over the fastest kernel: table 12.0%, "
        "always PyTorch's default 173.0%, analytic prior 43.0%; the lowest average slowdown decides, not how often "
        "a pick is the fastest)"
    )
    assert len(lines) == 1 + 5 + 1


def test_a_reference_without_scores_is_left_out():
    no_default = _quality(default=_choice(float("nan"), float("nan"), n=0), guarded=None, table=None,
                          verdict=None)
    rows = held_out_lines(no_default.to_dict())[1:]
    assert [row.split(":")[0].strip() for row in rows] == ["the analytic prior alone (a spec-sheet estimate)", "its cost model alone"]
    older_table = {"top1_accuracy": 0.75, "top1_within_noise": 0.8, "mean_slowdown": 0.05, "worst_slowdown": 0.4,
                   "spearman": 0.9, "n_problems": 8}
    assert held_out_lines(older_table)[1:] == [
        "  its cost model alone: fastest on 75.0% (80.0% within measurement noise), 5.0% slower on average, "
        "40.0% at worst; rank correlation 0.90"]


def test_every_verdict_says_who_ranks_kernels():
    assert Guard("prior", "held-out mean slowdown: table 30.0%, default 40.0%, prior 10.0%").describe() == (
        "outside measured buckets: the analytic prior (an estimate from the card's spec sheet) ranks kernels, not "
        "the table's model "
        "(held-out mean slowdown: table 30.0%, default 40.0%, prior 10.0%; the lowest average slowdown decides, "
        "not how often a pick is the fastest)")  # a stored table's older reason gets the same explanation
    busy = Guard("default", "measured on a machine too busy to time kernels (calibrate --allow-busy)").describe()
    assert busy == ("outside measured buckets: PyTorch's default serves, not the table's model "
                    "(measured on a machine too busy to time kernels (calibrate --allow-busy))")
    assert "lost" not in busy  # it did not lose on its data: the machine was too busy to trust the data
    assert Guard("table", "merged").describe() == "outside measured buckets: the table's model chooses (merged)"


def test_a_too_busy_calibration_says_what_is_stored(tmp_path, monkeypatch):
    from attn_dispatch.calibration.finish import fit_and_write
    from attn_dispatch.models.identity import DeviceIdentity
    from attn_dispatch.models.table_io import load_table
    from tests.models.synthetic import synthetic_measurements

    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    outcome = fit_and_write(synthetic_measurements(8, seed=7), DeviceIdentity.cpu(), out=None, seed=0, wall_s=1.0,
                            too_busy=True)
    lines = outcome.quality.splitlines()
    assert lines[-1].startswith("outside measured buckets: PyTorch's default serves")
    assert not any("the table as stored" in line for line in lines)
    assert not any(key.startswith("guarded_") for key in load_table(outcome.table_paths[0]).quality)
