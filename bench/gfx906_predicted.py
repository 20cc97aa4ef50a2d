"""What the analytic prior predicts on a gfx906 card (no card needed): per shape, PyTorch's default
(its math backend there), the portable PyTorch kernels alone (no Triton for the card), with the
Triton kernels (Triton >= 3.8), and with ``--allow-lossy bf16->fp16`` too. Every number is a
PREDICTION of `models.priors` / `models.triton_costs`, unmeasured; docs/GFX906.md quotes it.

    python -m bench.gfx906_predicted [--card "AMD Instinct MI50 32GB"] [--memory-gib 32]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import replace

from attn_dispatch.dispatcher.decision import format_seconds
from attn_dispatch.kernels import AccuracyPolicy, Kernel, Problem, all_kernels
from attn_dispatch.kernels.registry import TRITON_FAMILIES, uses_fused_backend, working_family
from attn_dispatch.models.identity import KNOWN_CARDS
from attn_dispatch.models.priors import prior_seconds

GIB = 2**30
GFX906_LDS = 64 * 1024  # bytes of LDS one program may use on gfx906
SHAPES = {  # issue 32's shapes (video DiT, long prefill, fill, decode)
    "Wan2.1 14B 480p: 1x40x32760, D128": Problem(1, 40, 40, 32760, 32760, 128, 128, "bfloat16", device_type="cuda"),
    "CogVideoX: 1x48x17776, D64": Problem(1, 48, 48, 17776, 17776, 64, 64, "bfloat16", device_type="cuda"),
    "32k causal prefill, GQA 32/4, D128": Problem(1, 32, 4, 32768, 32768, 128, 128, "bfloat16", causal=True,
                                                  device_type="cuda"),
    "2k fill on 32k keys, GQA 32/8, bool mask": Problem(1, 32, 8, 2048, 32768, 128, 128, "bfloat16", mask_kind="bool",
                                                        mask_shape=(1, 1, 2048, 32768), device_type="cuda"),
    "B8 decode at 32k keys, GQA 32/8, D128": Problem(8, 32, 8, 1, 32768, 128, 128, "bfloat16", device_type="cuda"),
}


def fastest(problem: Problem, kernels: Iterable[Kernel], spec, memory: int) -> tuple[str, float] | None:
    """The kernel the prior ranks first among those that run `problem` within `decision`."""
    timed = [(prior_seconds(problem, k, spec), k.name) for k in kernels
             if not k.reasons(problem) and problem.input_bytes + k.workspace_bytes(problem) <= memory]
    return (min(timed)[1], min(timed)[0]) if timed else None


def as_gfx906_with_triton_3_8() -> None:
    """Answer the Triton kernels' capability questions as a gfx906 card with Triton 3.8 would (this
    machine need not have one): its architecture, its 64 KiB of LDS, the Triton version."""
    from attn_dispatch.kernels import _triton_support, triton_decode, triton_flash

    _triton_support.gpu_architecture = lambda device_index=None: ("gfx906", (9, 0))
    _triton_support.triton_version = lambda: _triton_support.MIN_TRITON_FOR_ARCH["gfx906"]
    _triton_support.torch.version.hip = _triton_support.torch.version.hip or "6.2"
    for module in (triton_flash, triton_decode):
        module.shared_memory_limit = lambda device_index=None: GFX906_LDS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", default="AMD Instinct MI50 32GB", choices=sorted(KNOWN_CARDS))
    parser.add_argument("--memory-gib", type=float, default=None, help="memory to fit in (default: the card's)")
    args = parser.parse_args(argv)
    as_gfx906_with_triton_3_8()
    spec = KNOWN_CARDS[args.card]
    memory = int(args.memory_gib * GIB) if args.memory_gib else spec.memory_bytes
    lossless = [k for k in all_kernels(policy=AccuracyPolicy()) if not uses_fused_backend(k)]
    lossy = [k for k in all_kernels(policy=AccuracyPolicy.allowing("bf16->fp16")) if not uses_fused_backend(k)]
    without_triton = [k for k in lossless if working_family(k) not in TRITON_FAMILIES]
    math = next(k for k in all_kernels() if k.name == "sdpa_math")
    print(f"PREDICTED by the analytic prior of {spec.name} ({spec.source}), {memory / GIB:.0f} GiB; unmeasured")
    print("| shape | dtype | PyTorch's default (math) | portable, no Triton | with Triton >= 3.8 | + --allow-lossy bf16->fp16 |")
    print("|---|---|---|---|---|---|")
    for label, bf16 in SHAPES.items():
        for problem in (replace(bf16, dtype="float16"), bf16):
            fits = problem.input_bytes + math.workspace_bytes(problem) <= memory
            default = format_seconds(prior_seconds(problem, math, spec)) if fits else "out of memory"
            cells = [fastest(problem, kernels, spec, memory) for kernels in (without_triton, lossless, lossy)]
            text = [f"{format_seconds(s)} ({name})" if (name, s) != (None, None) else "-" for name, s in
                    (cell or (None, None) for cell in cells)]
            if problem.dtype == "float16":
                text[2] = "(same)"
            print(f"| {label} | {problem.dtype} | {default} | " + " | ".join(text) + " |")


if __name__ == "__main__":
    main()
