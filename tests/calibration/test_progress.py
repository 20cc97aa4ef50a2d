"""The calibration's progress bar (`calibration.session.Progress`)."""

from __future__ import annotations

from attn_dispatch.calibration.session import Progress


def test_no_bar_is_drawn_before_the_first_plan(capsys):
    """A too-busy refusal comes before any problem is planned: its one line stands alone."""
    progress = Progress(enabled=True)
    progress.close()
    assert capsys.readouterr().err == ""


def test_the_bar_counts_planned_problems_and_timed_points(capsys):
    progress = Progress(enabled=True)
    progress.plan(3)
    progress.record({"status": "ok"})
    progress.record({"status": "unsupported"})
    progress.problem()
    progress.close()
    err = capsys.readouterr().err
    assert "calibrating" in err and "1/3" in err
    assert progress.points == {"ok": 1, "unsupported": 1}


def test_a_point_before_the_first_plan_draws_no_empty_bar(capsys):
    """Points recorded before any plan (a resumed run's store) are counted and shown with the first plan."""
    progress = Progress(enabled=True)
    progress.record({"status": "ok"})
    assert capsys.readouterr().err == ""
    progress.plan(2)
    progress.close()
    err = capsys.readouterr().err
    assert "0problem" not in err and "points=1" in err
