"""What a fresh process pays the first time, on the CPU: the first `ad.attention` call (with
``import attn_dispatch``) against PyTorch's first SDPA call, a new small shape under `patched()`,
and the worst token of a decode loop whose key length crosses size buckets.

Every number comes from its own fresh process (``--child``), each with its own home: an empty
temporary one, or a fresh copy of ``--home`` (a calibrated home: ``attn-dispatch calibrate --quick``
makes one, with the fast path built), so no process sees what an earlier one kept. Medians over
``--repeats`` processes.

    python -m bench.first_call [--repeats 3] [--home CALIBRATED_HOME] [--json PATH]

Rows:
- ``sdpa first call``: ``F.scaled_dot_product_attention`` once, torch imported before the clock;
- ``ad first call``: ``import attn_dispatch`` and one ``ad.attention`` call (the import alone beside);
  both first-call rows give the process's CPU seconds beside the wall time (every thread's: on a
  machine shared with other work the wall time also holds the waits for a core);
- ``patched new shape``: under ``ad.patched()``, after three calls of one shape, the first call of a
  small shape of another size bucket (what a model's new layer shape or a new prompt length pays);
- ``modules``: which attn_dispatch modules run code in the first call and at a new key length of a
  decided bucket (`modules_run`);
- ``decode``: a decode loop (`bench.decode_loop.decode_pass`: 8 layers, one query row, GQA 8/2,
  D 64) from 900 keys over 300 tokens: its first token, the token whose key length first crosses
  into the next size bucket (1025 keys: a new bucket decision), the slowest of the other tokens and
  the median token, the dispatcher's against SDPA's, each in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SHAPE = (1, 8, 512, 64)  # batch, heads, tokens, head dim: a causal prefill, fp32
SMALL = (1, 4, 48, 32)  # the new small shape under patched(): another bucket than SHAPE's
DECODE = {"context": 900, "tokens": 300, "layers": 8, "heads": 8, "kv_heads": 2, "head_dim": 64}
NEW_BUCKET_KEYS = 1025  # the first key length of the next power-of-two bucket after the context's
SUBPACKAGES = ("dispatcher", "kernels", "models", "calibration")
MEASURED_CALLS = 60  # calls after which a bucket's measuring on calls has decided (`measuring`: 5 rounds of a few candidates)


def child(mode: str) -> dict:
    """One measurement in this (fresh) process."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    if mode == "sdpa":
        q = torch.randn(*SHAPE)
        start, cpu = time.perf_counter(), time.process_time()
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return {"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}
    if mode == "ad":
        q = torch.randn(*SHAPE)
        start, cpu = time.perf_counter(), time.process_time()
        import attn_dispatch as ad

        ad.attention  # noqa: B018 - the public API, imported on first use
        imported = time.perf_counter()
        ad.attention(q, q, q, is_causal=True)
        return {"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu, "import_s": imported - start}
    if mode == "patched":
        import attn_dispatch as ad

        q, small = torch.randn(*SHAPE), torch.randn(*SMALL)
        with ad.patched():
            for _ in range(3):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            start = time.perf_counter()
            F.scaled_dot_product_attention(small, small, small, is_causal=True)
            return {"seconds": time.perf_counter() - start}
    if mode in ("decode_sdpa", "decode_ad"):
        from bench.decode_loop import decode_pass

        d = DECODE
        total = d["context"] + d["tokens"]
        query = torch.randn(1, d["heads"], 1, d["head_dim"])
        cache_k, cache_v = (torch.randn(1, d["kv_heads"], total, d["head_dim"]) for _ in range(2))
        if mode == "decode_ad":
            import attn_dispatch as ad

            attend = ad.attention
        else:
            attend = F.scaled_dot_product_attention
        per_token = decode_pass(attend, query, cache_k, cache_v, d["context"], d["tokens"], d["layers"])
        crossing = NEW_BUCKET_KEYS - d["context"]
        others = [s for i, s in enumerate(per_token) if i not in (0, crossing)]
        return {"seconds": per_token[crossing], "first_token_s": per_token[0], "worst_other_s": max(others),
                "median_token_s": statistics.median(per_token)}
    if mode == "modules":
        return modules_run()
    raise ValueError(f"unknown mode {mode!r}")


def modules_run() -> dict:
    """Which attn_dispatch modules run code (`sys.setprofile`: a Python frame of theirs starts) during
    this process's first `ad.attention` call (``import attn_dispatch`` done before it), and during the
    first call at a new key length of a bucket decided and measured already (a decode step's next
    token): the module names and the Python calls made, as ``{"cold": [...], "cold_calls": n,
    "new_key_length": [...], "new_key_length_calls": n}``."""
    import importlib.util

    import torch

    import attn_dispatch as ad

    package = {path for name in ("attn_dispatch", *(f"attn_dispatch.{sub}" for sub in SUBPACKAGES))
               for path in importlib.util.find_spec(name).submodule_search_locations}
    attention = ad.attention  # looked up (imported) before the clock, as a model's first call finds it

    def profiled(call) -> tuple[list[str], int]:
        files, calls = set(), [0]

        def profile(frame, event, arg):
            if event == "call":
                calls[0] += 1
                name = frame.f_code.co_filename
                if name.rsplit("/", 1)[0] in package:
                    files.add(name)

        sys.setprofile(profile)
        try:
            call()
        finally:
            sys.setprofile(None)
        return sorted("/".join(name.rsplit("/", 2)[-2:]) for name in files), calls[0]

    query, keys = torch.randn(1, 8, 1, 64), torch.randn(1, 2, DECODE["context"], 64)
    cold, cold_calls = profiled(lambda: attention(query, keys, keys, enable_gqa=True))
    for _ in range(MEASURED_CALLS):  # the bucket's measuring on calls decides within these
        attention(query, keys, keys, enable_gqa=True)
    longer = torch.randn(1, 2, DECODE["context"] + 1, 64)
    new, new_calls = profiled(lambda: attention(query, longer, longer, enable_gqa=True))
    return {"cold": cold, "cold_calls": cold_calls, "new_key_length": new, "new_key_length_calls": new_calls}


def run_child(mode: str, home: str | None) -> dict:
    """`mode` in a fresh process with a fresh home (empty, or a copy of `home`)."""
    with tempfile.TemporaryDirectory() as scratch:
        own = os.path.join(scratch, "home")
        if home is not None:
            shutil.copytree(home, own)
        else:
            os.mkdir(own)
        env = {**os.environ, "ATTN_DISPATCH_HOME": own}
        done = subprocess.run([sys.executable, "-m", "bench.first_call", "--child", mode], capture_output=True,
                              text=True, env=env, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per row (median)")
    parser.add_argument("--home", default=None, help="a calibrated home, copied afresh for every process")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    rows = {}
    modules = run_child("modules", args.home)
    print(f"modules running code: {len(modules['cold'])} in the first call ({modules['cold_calls']} Python calls), "
          f"{len(modules['new_key_length'])} at a new key length of a decided bucket "
          f"({modules['new_key_length_calls']} Python calls)", flush=True)
    for label, mode in (("sdpa first call", "sdpa"), ("ad first call", "ad"), ("patched new shape", "patched"),
                        ("decode new-bucket token, sdpa", "decode_sdpa"), ("decode new-bucket token, ad", "decode_ad")):
        runs = [run_child(mode, args.home) for _ in range(args.repeats)]
        rows[label] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        rows[label]["runs_s"] = [run["seconds"] for run in runs]
        extra = "".join(f", {key} {value * 1e3:.1f} ms" for key, value in rows[label].items()
                        if key not in ("seconds", "runs_s"))
        print(f"{label}: {rows[label]['seconds'] * 1e3:.1f} ms (runs {', '.join(f'{s * 1e3:.1f}' for s in rows[label]['runs_s'])}){extra}",
              flush=True)
    added = rows["ad first call"]["seconds"] - rows["sdpa first call"]["seconds"]
    added_cpu = rows["ad first call"]["cpu_s"] - rows["sdpa first call"]["cpu_s"]
    print(f"the first ad.attention call (import included) adds {added * 1e3:.1f} ms over PyTorch's first SDPA call "
          f"({added_cpu * 1e3:.1f} ms of CPU time); load average {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "added_s": added, "home": args.home, "load": os.getloadavg(), "modules": modules},
                      out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
