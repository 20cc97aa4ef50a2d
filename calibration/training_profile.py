"""The training profile: forward+backward times of every kernel with a backward, per problem, so
the dispatcher's training route (`dispatcher.training_route`) is ordered by measurements.

    attn-dispatch calibrate --training ...    (after the inference sweep, on the first device)
    python -m attn_dispatch.calibration.training_profile --device cuda --kernels portable --memory-budget-gib 16

Both write ``<home>/training_profile.json`` (or ``--out PATH`` and
``ATTN_DISPATCH_TRAINING_PROFILE=PATH``), in `models.training_times`'s format. A kernel is timed
only where its declared forward+backward memory fits the budget and a share of free memory; one
that raises is listed under ``skipped`` with its error.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import DEFAULT, QUICK, TimerSettings, time_repetitions
from attn_dispatch.kernels import Kernel, Problem, all_kernels, portable_kernels
from attn_dispatch.kernels.base import training_bytes
from attn_dispatch.kernels.registry import serving
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel
from attn_dispatch.models.training_times import FORMAT_VERSION, KIND, default_profile_path, device_label

FREE_MEMORY_SHARE = 0.5  # largest share of free memory one timed forward+backward may plan for


def training_problems(device_type: str, *, quick: bool) -> list[Problem]:
    """Training-shaped problems: causal LLM prefill (GQA 4, D=128) and non-causal video
    self-attention (D=128), at lengths a CPU finishes in seconds, a GPU's up to 32,760 tokens."""
    if device_type == "cuda":
        lengths, dtypes, video_heads = ((1024, 4096) if quick else (1024, 4096, 8192, 32760)), ("bfloat16", "float16"), 40
    else:
        lengths, dtypes, video_heads = ((128, 512) if quick else (128, 512, 1024)), ("float32", "bfloat16"), 8
    problems = []
    for dtype in dtypes:
        for length in lengths:
            problems.append(Problem(1, 32, 8, length, length, 128, 128, dtype, causal=True, device_type=device_type))
            problems.append(Problem(1, video_heads, video_heads, length, length, 128, 128, dtype, device_type=device_type))
    return problems


def training_kernels(kernel_set: str) -> list[Kernel]:
    """Every kernel with a backward in ``"all"`` or ``"portable"``, and PyTorch's default (always
    a contender)."""
    kernels = serving(all_kernels() if kernel_set == "all" else portable_kernels())
    return [k for k in kernels if k.supports_backward] + [SdpaDefaultKernel()]


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return None


def time_training(kernel: Kernel, problem: Problem, device: torch.device, settings: TimerSettings) -> float:
    """Median seconds of one forward plus backward (gradients of query, key and value)."""
    inputs = make_inputs(problem, device)
    leaves = [t.detach().requires_grad_(True) for t in (inputs.query, inputs.key, inputs.value)]
    grad_out = torch.randn(
        (problem.batch, problem.q_heads, problem.q_len, problem.value_dim), device=device, dtype=problem.torch_dtype)

    def step(_: int) -> None:
        out = kernel(*leaves, attn_mask=inputs.attn_mask, is_causal=problem.causal, enable_gqa=inputs.enable_gqa)
        torch.autograd.grad(out, leaves, grad_out.view(out.shape))

    return time_repetitions(step, device, settings).median_s


def measure_profile(device: torch.device, problems: Sequence[Problem], kernels: Sequence[Kernel], *,
                    budget: int | None, settings: TimerSettings = DEFAULT) -> dict:
    """Time every (problem, kernel) that can run and fits; the profile as a JSON-ready dict."""
    entries, skipped = [], []
    for problem in problems:
        free = _free_bytes(device)
        for kernel in kernels:
            need = training_bytes(kernel, problem)
            why = "; ".join(kernel.reasons(problem))
            if not why and budget is not None and need > budget:
                why = f"forward+backward needs {need} B, over the budget of {budget} B"
            if not why and free is not None and need > FREE_MEMORY_SHARE * free:
                why = f"forward+backward needs {need} B, over {FREE_MEMORY_SHARE:.0%} of the {free} B free"
            if not why:
                try:
                    seconds = time_training(kernel, problem, device, settings)
                    entries.append({"problem": problem.to_dict(), "kernel": kernel.name, "seconds": seconds,
                                    "training_bytes": need})
                    continue
                except Exception as error:  # noqa: BLE001 - a failing kernel scores nothing
                    why = f"{type(error).__name__}: {error}"
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            skipped.append({"problem": problem.to_dict(), "kernel": kernel.name, "reason": why})
    return {
        "format_version": FORMAT_VERSION, "kind": KIND, "device": device_label(device),
        "torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_bytes": budget, "timer": settings.to_dict(), "entries": entries, "skipped": skipped,
    }


def write_profile(device: torch.device | str, *, kernel_set: str, budget: int | None, quick: bool,
                  path: str | Path | None = None) -> str:
    """Measure and write the profile (default: `models.training_times.default_profile_path`,
    where the training route finds it); returns a one-line summary."""
    device = torch.device(device)
    profile = measure_profile(device, training_problems(device.type, quick=quick), training_kernels(kernel_set),
                              budget=budget, settings=QUICK if quick else DEFAULT)
    target = Path(path).expanduser() if path is not None else default_profile_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(profile, indent=1) + "\n")
    return f"training profile: {len(profile['entries'])} forward+backward timings, {len(profile['skipped'])} skipped -> {target}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time forward+backward of every kernel with a backward.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernels", choices=("all", "portable"), default="all")
    parser.add_argument("--memory-budget-gib", type=float, default=None,
                        help="e.g. 16: kernels whose forward+backward needs more GiB are skipped")
    parser.add_argument("--quick", action="store_true", help="fewer problems, a looser timer")
    parser.add_argument("--out", default=None,
                        help="profile JSON to write (default: <home>/training_profile.json, where the dispatcher looks)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    budget = None if args.memory_budget_gib is None else int(args.memory_budget_gib * 2**30)
    print(write_profile(device, kernel_set=args.kernels, budget=budget, quick=args.quick, path=args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
