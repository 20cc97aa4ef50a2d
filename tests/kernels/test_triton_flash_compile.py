"""The Triton kernels (`triton_flash`'s and `triton_decode`'s) compile for GPU targets on a CPU machine:
Triton builds them ahead of time for an H100/H200 (sm_90) and for gfx906 without a GPU, so CI catches
what the interpreter cannot (types of loop-carried values, layouts, a shared-memory need past the card's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from attn_dispatch.kernels._triton_support import MIN_TRITON_FOR_ARCH, triton_version  # noqa: E402

SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attn_dispatch.kernels import _triton_flash_backward as backward, _triton_flash_forward as forward
from attn_dispatch.kernels import _triton_decode_kernels as decode
from attn_dispatch.kernels._triton_flash_config import BOOL_MASK, FLOAT_MASK
from attn_dispatch.kernels.triton_flash import padded_dim

backend, arch, warp_size, mask_kind, stages = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
target = GPUTarget(backend, int(arch) if arch.isdigit() else arch, warp_size)
element = "*fp16"
mask = {BOOL_MASK: "*u8", FLOAT_MASK: element}.get(mask_kind, element)
pointers = dict(Q=element, K=element, V=element, Mask=mask, Out=element, GradOut=element, DK=element, DV=element,
                DQ=element, Lse="*fp32", Delta="*fp32", PartOut="*fp32", PartMax="*fp32", PartSum="*fp32")
head_dim = 80  # padded to 128: masked loads along the head dim
shared = dict(HEAD_DIM=head_dim, VALUE_DIM=head_dim, BLOCK_D=padded_dim(head_dim), BLOCK_DV=padded_dim(head_dim),
              MASK_KIND=mask_kind, CAUSAL=True, DOT_PRECISION=None)

def build(kernel, constexprs, warps):
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name == "scale" else "i32")
                 for name in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=target,
                              options={"num_warps": warps, "num_stages": stages})
    return compiled.metadata.shared

sizes = [
    build(forward.flash_forward_kernel, {**shared, "BLOCK_M": 64, "BLOCK_N": 32, "STORE_LSE": True}, 4),
    build(backward.key_grad_kernel, {**shared, "BLOCK_M": 32, "BLOCK_N": 64}, 4),
    build(backward.query_grad_kernel, {**shared, "BLOCK_M": 64, "BLOCK_N": 32}, 4),
    build(backward.delta_kernel, {"VALUE_DIM": head_dim, "BLOCK_DV": padded_dim(head_dim), "BLOCK_M": 64}, 4),
    build(decode.split_kernel, {**shared, "BLOCK_M": 16, "BLOCK_N": 64, "DIRECT": False}, 4),
    build(decode.merge_kernel, {"VALUE_DIM": head_dim, "BLOCK_DV": padded_dim(head_dim), "BLOCK_R": 8, "BLOCK_S": 4}, 4),
]
print(" ".join(map(str, sizes)))
"""


@pytest.mark.parametrize(("target", "mask_kind"), [(("cuda", "90", "32"), "2"), (("hip", "gfx906", "64"), "1")],
                         ids=["sm_90-float-mask", "gfx906-bool-mask"])
def test_kernels_compile_for_gpu_targets(target, mask_kind):
    """Forward, dK/dV, dQ and delta kernels, the split-KV decode kernel and its merge kernel, causal,
    head dim 80, fp16, 2 stages, in a fresh process without the interpreter; each fits gfx906's 64 KiB
    of LDS."""
    oldest = MIN_TRITON_FOR_ARCH.get(target[1])
    if oldest is not None and triton_version() < oldest:
        pytest.skip(f"Triton {triton_version()} does not compile for {target[1]} (needs {oldest})")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, *target, mask_kind, "2"], capture_output=True, text=True,
                          timeout=600, env=env)
    if done.returncode and ("ASTSource" in done.stderr or "GPUTarget" in done.stderr):
        pytest.skip(f"this Triton's ahead-of-time API differs: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = [int(size) for size in done.stdout.split()]
    assert len(sizes) == 6 and all(size <= 64 * 1024 for size in sizes), sizes
