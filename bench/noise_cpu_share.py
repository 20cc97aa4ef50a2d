"""The busy-machine probe (`calibration.noise`) quiet and under load: where the CPU-share
thresholds `BUSY_CPU_SHARE` and `STOP_CPU_SHARE` come from.

For each number of spinning processes (pure-Python loops, one core each, started before and
stopped after), `--probes` probes on the CPU; prints each probe's median, spread, CPU share and
verdict, and the load average per CPU (other users' processes count in it too: say so when
quoting the numbers).

    python -m bench.noise_cpu_share                       # 0, 1 and 2 spinners, 6 probes each
    python -m bench.noise_cpu_share --spinners 0 2 --probes 10 --threads 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import torch

from attn_dispatch.calibration.noise import probe_noise
from bench.quick_mode_cpu import spin

# Seconds the spinners run before the first probe (the scheduler settles, the load average rises).
SETTLE_S = 2.0
# A spinner's own time limit: it stops even if this bench is killed.
SPIN_LIMIT_S = 600.0


def probes_under(spinners: int, probes: int) -> list[str]:
    """`probes` probe lines while `spinners` processes spin."""
    workers = [multiprocessing.Process(target=spin, args=(SPIN_LIMIT_S,), daemon=True) for _ in range(spinners)]
    for process in workers:
        process.start()
    try:
        time.sleep(SETTLE_S if spinners else 0.0)
        lines = []
        for _ in range(probes):
            noise = probe_noise("cpu")
            lines.append(f"spinners {spinners}: median {noise.median_s * 1e3:7.2f} ms, spread {noise.spread:6.0%}, "
                         f"CPU share {noise.cpu_share:.2f}, load/CPU {noise.load_per_cpu:.2f}: "
                         f"{noise.describe().split(':')[0]}")
            print(lines[-1], flush=True)
        return lines
    finally:
        for process in workers:
            process.terminate()
            process.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spinners", type=int, nargs="+", default=[0, 1, 2], help="spinning processes per condition")
    parser.add_argument("--probes", type=int, default=6, help="probes per condition")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}")
    probe_noise("cpu")  # warm: the first probe pays for imports and allocations
    for spinners in args.spinners:
        probes_under(spinners, args.probes)


if __name__ == "__main__":
    main()
