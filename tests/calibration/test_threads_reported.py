"""A CPU calibration says how many torch threads it timed with (``--threads``), not only the
logical CPUs its card model counts ("AMD EPYC (2 threads)"): in the summary's first line and in
the stored table's provenance notes (what `attn-dispatch show` prints), and as the table's
``provenance.timing_threads`` field (what the dispatcher compares with a process's count)."""

from __future__ import annotations

import torch

from attn_dispatch.calibration.session import calibrate
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.models.identity import DeviceIdentity, torch_threads
from attn_dispatch.models.table_io import load_table
from attn_dispatch.models.table_summary import summary_lines
from tests.calibration.helpers import small_config


def test_torch_threads_words():
    assert torch_threads(1) == "1 torch thread"
    assert torch_threads(2) == "2 torch threads"


def test_the_summary_and_the_table_name_the_threads_used_not_the_process_default(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the process default differs from --threads 1
    try:
        summary = calibrate(small_config(tmp_path, problems=2, threads=1), show_progress=False,
                            kernels=[MathKernel()], out=tmp_path / "table.json")
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert used == 1 and summary.reports[0].threads == 1
    cpus = DeviceIdentity.cpu().compute_units
    first = summary.lines()[0]
    assert first.startswith(f"calibrated {summary.identity.model_key} on cpu, timing with 1 torch thread of its "
                            f"{cpus} logical CPUs, in ")
    table = load_table(tmp_path / "table.json")
    assert f"timed with 1 torch thread of its {cpus} logical CPUs" in table.provenance.notes
    assert f"note: timed with 1 torch thread of its {cpus} logical CPUs" in summary_lines(table)
    assert table.provenance.timing_threads == 1 == summary.timing_thread_count()
