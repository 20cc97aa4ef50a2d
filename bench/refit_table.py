"""Refit a card's threshold table from a recorded calibration (after a cost-model change), on any
machine: the same gate, fit and table build as `attn-dispatch calibrate`'s last step.

    ATTN_DISPATCH_HOME=/tmp/home python -m bench.refit_table bench/results/h200_calibrations/run4_fixed_timer --out table.json

Reads ``<run>_measurements.jsonl.gz`` and ``<run>_summary.json`` (the card's identity and wall
time); stores the table where the dispatcher looks it up under ``ATTN_DISPATCH_HOME`` and at
``--out``; prints the held-out quality.

Off the card, PyTorch's backends are assumed to work (`kernels.sdpa_probe.assume_backends_available`),
but one feature still differs from what the card computes: the workspace of ``sdpa_default``,
which depends on the backend PyTorch picks there (this machine cannot ask). On run 4 that skew
moved the held-out mean slowdown of the same model from 18% (fit on the H200) to 22% (refit on a
CPU). A table for users is best fitted on the card itself (`attn-dispatch calibrate`, `check --fix`).
"""

from __future__ import annotations

import argparse
import gzip
import json

from attn_dispatch.calibration.finish import fit_and_write
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="path prefix of <run>_measurements.jsonl.gz and <run>_summary.json")
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split (calibrate's default: 0)")
    args = parser.parse_args()
    with open(f"{args.run}_summary.json") as handle:
        summary = json.load(handle)
    with gzip.open(f"{args.run}_measurements.jsonl.gz", "rt") as handle:
        measurements = [Measurement.from_dict(json.loads(line)) for line in handle]
    outcome = fit_and_write(measurements, DeviceIdentity.from_dict(summary["identity"]), out=args.out,
                            seed=args.seed, wall_s=summary["wall_s"])
    print(f"held-out quality: {outcome.quality}")
    print(f"tables: {', '.join(str(p) for p in outcome.table_paths)}")
    if outcome.note:
        print(f"note: {outcome.note}")


if __name__ == "__main__":
    main()
