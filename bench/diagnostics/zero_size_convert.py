"""Why do convert[...] kernels return None on zero-size CUDA inputs? (issue 13, GPU suite)"""
import sys

import torch

from attn_dispatch.kernels import AccuracyPolicy, kernel_from_name

NAMES = ["convert[fp16->fp32]+chunked[q=512,kv=4096]", "convert[fp16->bf16]+sdpa_flash",
         "convert[fp16->fp32]+sdpa_efficient", "convert[bf16->fp16]+small_q[splits=8]"]
SHAPES = {"batch_0": ((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)), "heads_0": ((1, 0, 3, 8), (1, 0, 4, 8), (1, 0, 4, 8)),
          "value_dim_0": ((1, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 0))}


def tracer(frame, event, arg):
    if event == "return" and arg is None and "attn_dispatch" in frame.f_code.co_filename:
        print("   None from", frame.f_code.co_filename.split("site/")[-1], frame.f_code.co_name, frame.f_lineno)
    return tracer


for name in NAMES:
    kernel = kernel_from_name(name, policy=AccuracyPolicy.allowing("any"))
    for shape, sizes in SHAPES.items():
        dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[name.split("[")[1].split("-")[0]])
        q, k, v = (torch.randn(s).to("cuda", dtype) for s in sizes)
        q.requires_grad_()
        sys.setprofile(tracer)
        try:
            out = kernel(q, k, v)
        except Exception as error:  # noqa: BLE001
            out = repr(error)
        sys.setprofile(None)
        print(name, shape, type(out).__name__, getattr(out, "shape", out), flush=True)
