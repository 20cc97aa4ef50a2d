"""What does the dispatcher decide for the decode loop's shapes (sliced and dense K/V)?"""
import torch

import attn_dispatch as ad

for batch, context in ((8, 8192), (1, 8192), (8, 1024)):
    cache = torch.randn(batch, 8, context + 64, 128, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    for layout in ("slice", "contiguous"):
        k = cache[:, :, :context]
        if layout == "contiguous":
            k = k.contiguous()
        d = ad.Dispatcher().explain(q, k, k, enable_gqa=True)
        print(f"== B{batch} ctx {context} {layout}: {d.kernel}")
        for c in d.candidates[:6]:
            print("   ", c)
        for n in d.notes:
            print("   note:", n[:300])
