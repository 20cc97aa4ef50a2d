"""Large finite mask penalties on CUDA: which rows go wrong, in PyTorch itself and in our kernels?"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_dispatch.calibration.peak_memory import measure_peak_bytes
from attn_dispatch.kernels import ChunkedKernel, kernel_from_name, reference_attention
from tests.kernels.cases import Case

torch.set_printoptions(precision=3, sci_mode=False, linewidth=200)
for dtype in ("bfloat16", "float16"):
    for causal in (False, True):
        inputs = Case(dtype=dtype, q_len=4, kv_len=6).build("cuda")
        q, k, v = inputs["query"], inputs["key"], inputs["value"]
        mask = torch.zeros(1, 1, 4, 6, device="cuda", dtype=torch.float32)
        mask[..., 0, 0] = -1e5
        mask[..., 1, :] = -1e5
        mask[..., 2, :3] = -1e5
        mask[..., 3, 2] = float("-inf")
        ref = reference_attention(q, k, v, attn_mask=mask, is_causal=causal).float()
        print(f"== {dtype} causal={causal} q{tuple(q.shape)} k{tuple(k.shape)}")
        def rowerr(out):
            out = out.float()
            return [round(float((out[..., r, :] - ref[..., r, :]).norm() / ref[..., r, :].norm().clamp_min(1e-9)), 3)
                    for r in range(4)]
        for backend in (None, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
            for m in (mask, mask.to(q.dtype)):
                try:
                    if causal:
                        continue
                    if backend is None:
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                    else:
                        with sdpa_kernel([backend]):
                            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                    print(f"  pytorch {backend} mask {m.dtype}: row errors {rowerr(out)}")
                except Exception as e:  # noqa: BLE001
                    print(f"  pytorch {backend} mask {m.dtype}: {type(e).__name__} {str(e)[:100]}")
        for name in ("sdpa_default", "sdpa_efficient", "sdpa_cudnn", "math", "chunked[q=512,kv=4096]"):
            try:
                out = kernel_from_name(name)(q, k, v, attn_mask=mask, is_causal=causal)
                print(f"  {name}: row errors {rowerr(out)}")
            except Exception as e:  # noqa: BLE001
                print(f"  {name}: {type(e).__name__} {str(e)[:100]}")

kernel = ChunkedKernel(q=64, kv=128)
for length in (128, 256, 512, 128, 512, 1024):
    inputs = Case(q_len=length, kv_len=length, kv_heads=1).build("cuda")
    leaves = [inputs.pop(n).requires_grad_(True) for n in ("query", "key", "value")]
    out = kernel(*leaves, **inputs)
    g = torch.randn_like(out)
    peak = measure_peak_bytes(lambda: torch.autograd.grad(kernel(*leaves, **inputs), leaves, g), leaves[0].device)[0]
    print("backward peak", length, peak, "inputs bytes", sum(t.numel() * t.element_size() for t in leaves))
