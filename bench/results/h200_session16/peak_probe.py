"""Session 16, run 4: why the GPU kernel suite measured workspace peaks of 0 bytes. For the three
cases that failed in run 1, each measured 20 times in one process (fresh inputs each time, as the
suite builds them): the allocator's peak over the start, and the bytes it allocated and freed
during the call (cumulative counters). A peak of 0 with more bytes freed than the call's own
allocations means memory held before the call was released inside it.

    ATTN_DISPATCH_TEST_DEVICE=cuda python bench/results/h200_session16/peak_probe.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from attn_dispatch.kernels import AccuracyPolicy, kernel_from_name  # noqa: E402
from tests.kernels.cases import Case  # noqa: E402
from tests.kernels.test_workspace import WORKSPACE_CASES  # noqa: E402

CASES = [("convert[fp32->bf16]+sdpa_cudnn", "prefill_causal"), ("convert[fp32->fp16]+sdpa_efficient", "float_mask_fp16"),
         ("sdpa_cudnn", "float_mask_fp16")]
device = torch.device("cuda")
results = {}
for name, case_name in CASES:
    kernel = kernel_from_name(name, policy=AccuracyPolicy.allowing("any"))
    case = WORKSPACE_CASES[case_name]
    source = getattr(kernel, "source", None)
    if source and case.dtype != source:
        case = Case(**{**case.__dict__, "dtype": source})
    for flush in (False,):  # the flush A/B was dropped before it ran (it cannot change allocated bytes)
        rows = []
        for _ in range(20):
            inputs = case.build(device)
            q, k, v = inputs.pop("query"), inputs.pop("key"), inputs.pop("value")
            with torch.inference_mode():
                kernel(q, k, v, **inputs)
                torch.cuda.synchronize()
                stats = torch.cuda.memory_stats(device)
                before_alloc, before_freed = stats["allocated_bytes.all.allocated"], stats["allocated_bytes.all.freed"]
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
                out = kernel(q, k, v, **inputs)
                torch.cuda.synchronize()
                stats = torch.cuda.memory_stats(device)
                rows.append({"peak": torch.cuda.max_memory_allocated(device) - before,
                             "allocated": stats["allocated_bytes.all.allocated"] - before_alloc,
                             "freed": stats["allocated_bytes.all.freed"] - before_freed,
                             "out": out.numel() * out.element_size()})
                del out
        zeros = sum(r["peak"] <= 0 for r in rows)
        results[f"{name} {case_name} flush={flush}"] = rows
        print(f"{name} {case_name} flush={flush}: peaks of 0 in {zeros}/20; first rows {rows[:3]}", flush=True)
json.dump(results, open(os.path.join(os.environ.get("OUT", "."), "peak_probe.json"), "w"))
