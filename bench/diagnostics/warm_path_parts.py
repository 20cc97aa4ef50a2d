"""Where the warm path's time goes: copies of `Dispatcher.attention`'s warm path, each stopping
after one more step (compile check, context check, key, training check, plan lookup, count),
timed interleaved against PyTorch's SDPA on a tiny decode call (min over rounds). The copies
follow `dispatcher/core.py` as of the warm path's second pass (meta found on a miss, the lookup by
subscript, `Plan.sdpa_flags`); re-check them after editing the warm path.

Usage (repository root): python -m bench.diagnostics.warm_path_parts [--rounds 25] [--calls 10000]
"""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher import Dispatcher, core
from attn_dispatch.dispatcher._plan import cache_key
from bench.diagnostics.warm_path_tiny import arguments, fastest_us

STEPS = ("frame + in-place call", "+ compile check", "+ context check", "+ key", "+ training check",
         "+ plan lookup", "+ count/settle")
_WARM_PATH = '''
def warm(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if STEPS >= 1 and (_dynamo_compiling() or _compile_flags._is_compiling_flag):
        return None
    if STEPS >= 2 and (type(query) is not _Tensor or (attn_mask is not None and attn_mask.__class__ is not _Tensor)
                       or (_respecting[0] and not (_flash_on() and _efficient_on() and _math_on() and _cudnn_on()))):
        return None
    if STEPS >= 3:
        key_ = (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
                query.device, key.device, value.device,
                query.is_contiguous() and key.is_contiguous() and value.is_contiguous(),
                None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device, attn_mask.__class__),
                is_causal, enable_gqa)
    if STEPS >= 4 and (dropout_p != 0.0 or (_grad_enabled() and (query.requires_grad or key.requires_grad
                                                                  or value.requires_grad))):
        return None
    if STEPS >= 5:
        try:
            plan = self._plan_table[key_]
        except KeyError:
            plan = None
        if plan is None or plan.recheck:
            return None
    else:
        plan = PLAN
    if STEPS >= 6:
        count = plan.count
        calls = count[0] + 1
        count[0] = calls
        if calls == plan.settle_at:
            return None
    flags = plan.sdpa_flags
    try:
        if flags is not None:
            if scale is None:
                return _sdpa(query, key, value, attn_mask, **flags)
            return _sdpa(query, key, value, attn_mask, scale=scale, **flags)
        return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
    except Exception:
        raise
'''


def main() -> None:
    args = arguments(__doc__)
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    ours = Dispatcher(kernels=["sdpa_default"])
    with torch.inference_mode():
        ours.attention(q, k, v, enable_gqa=True)
        names = {name: getattr(core, name) for name in ("_sdpa", "_Tensor", "_respecting", "_flash_on", "_efficient_on",
                                                        "_math_on", "_cudnn_on", "_grad_enabled", "_dynamo_compiling",
                                                        "_compile_flags")}
        calls = {"sdpa": lambda: core._sdpa(q, k, v, enable_gqa=True)}
        for steps, label in enumerate(STEPS):
            scope = {**names, "STEPS": steps, "PLAN": ours._plans.get(cache_key(q, k, v, None, False, True))}
            exec(_WARM_PATH, scope)  # noqa: S102 - the copy above, one step longer each time
            calls[label] = (lambda warm: lambda: warm(ours, q, k, v, enable_gqa=True))(scope["warm"])
        calls["Dispatcher.attention"] = lambda: ours.attention(q, k, v, enable_gqa=True)
        best = fastest_us(calls, args.rounds, args.calls)
    previous = best["sdpa"]
    for label, per_call in best.items():
        print(f"{label:22s} {per_call:6.2f} us  total {per_call - best['sdpa']:+.2f}  step {per_call - previous:+.2f}")
        previous = per_call

if __name__ == "__main__":
    main()
