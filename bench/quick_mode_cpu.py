"""`attn-dispatch calibrate --quick` on this CPU, then the dispatcher it leaves behind on held-out
shapes: wall time of the calibration, what its noise probe said, and `attn-dispatch bench`'s
dispatcher / oracle and dispatcher / PyTorch-default ratios (geomean and worst).

Each run uses a fresh ``ATTN_DISPATCH_HOME`` (no earlier table). ``--busy N`` starts N processes
that spin on the CPU for the whole run (the issue's "both cores busy" is ``--busy 2`` on 2 cores);
the load average before and after is printed too, because on a shared machine other users' load
adds to it.

    python -m bench.quick_mode_cpu                      # quiet as the machine is
    python -m bench.quick_mode_cpu --busy 2             # both cores kept busy
    python -m bench.quick_mode_cpu --busy 2 --bench-unloaded  # busy while calibrating only
    python -m bench.quick_mode_cpu --allow-busy --json bench/results/quick_mode_cpu.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("attn-dispatch")


def spin(stop_after_s: float) -> None:
    """Keep one core busy (pure Python arithmetic) for `stop_after_s` seconds."""
    end = time.time() + stop_after_s
    value = 0
    while time.time() < end:
        value = (value * 31 + 7) % 1000003


def stop(spinners: list) -> None:
    """End the spinning processes (those still running) and wait for them."""
    for process in spinners:
        if process.is_alive():
            process.terminate()
            process.join()


def load_average() -> float:
    return os.getloadavg()[0]


def run(command: list[str], env: dict) -> tuple[int, float, str]:
    began = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    return done.returncode, time.time() - began, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=0, help="spinning processes kept running meanwhile")
    parser.add_argument("--bench-unloaded", action="store_true",
                        help="stop the spinning processes before the bench (its ratios then judge the table, not the load)")
    parser.add_argument("--allow-busy", action="store_true", help="pass --allow-busy to calibrate")
    parser.add_argument("--scenario", default="heldout", help="bench scenario (default: heldout)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="quick_mode_cpu_")
    env = {**os.environ, "ATTN_DISPATCH_HOME": home}
    spinners = [multiprocessing.Process(target=spin, args=(3600.0,), daemon=True) for _ in range(args.busy)]
    for process in spinners:
        process.start()
    result: dict = {"busy_processes": args.busy, "cpu_count": os.cpu_count(), "load_before": load_average()}
    try:
        summary_path = Path(home) / "summary.json"
        calibrate = [str(SCRIPT), "calibrate", "--quick", "--device", "cpu", "--quiet", "--summary-json", str(summary_path)]
        code, seconds, text = run(calibrate + (["--allow-busy"] if args.allow_busy else []), env)
        result.update(calibrate_exit=code, calibrate_wall_s=round(seconds, 1), load_after_calibrate=load_average(),
                      calibrate_output=text.strip().splitlines())
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            result.update(problems=summary["problems"], workers=summary["workers"], quality=summary["quality"],
                          noise_start=summary.get("noise_start"), noise_end=summary.get("noise_end"),
                          cpu_share_start=summary.get("cpu_share_start"), cpu_share_end=summary.get("cpu_share_end"),
                          noise_verdicts=summary.get("noise_verdicts"))
        if args.bench_unloaded:
            stop(spinners)
            result["load_before_bench"] = load_average()
        bench_json = Path(home) / "bench.json"
        code, seconds, text = run([str(SCRIPT), "bench", "--scenario", args.scenario, "--device", "cpu", "--quiet",
                                   "--json", str(bench_json)], env)
        result.update(bench_exit=code, bench_wall_s=round(seconds, 1), load_after_bench=load_average())
        if bench_json.exists():
            report = json.loads(bench_json.read_text())
            result["bench"], result["bench_shapes"] = report["summary"], report["shapes"]
        else:
            result["bench_output"] = text.strip().splitlines()[-5:]
    finally:
        stop(spinners)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
