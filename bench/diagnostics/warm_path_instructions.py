"""The dispatcher's warm-path cost as machine instructions per call, counted by valgrind's
callgrind: unlike a timing, the count does not move with the load of a shared machine, so two
versions of the warm path compare in one run each (about 9,000 instructions made 1 us on the
2-core dev VM, 2026-12-01).

PyTorch's SDPA is replaced by a no-op C function taking any arguments (``"".format``), both in
the warm path's in-place call (`core._sdpa`) and as the direct call it is compared with: the
kernel's own count varies by 1,000-6,000 instructions between call sites and processes (its
buffers' addresses), more than the changes being measured. What PyTorch's argument parser spends
on the keywords passed is left out (~270 instructions a keyword, `warm_path_pieces`). For each
case, N calls run inside one `functools.reduce`, the only function whose instructions are
counted (one dump per reduce). Next to each case, the floor any Python dispatcher pays
(`bench.dispatch_overhead.floor_calls`, calling the same no-op): a pure-Python pass-through of
SDPA's signature, and the same plus one guard check of the tensors (`hot_path.tensor_guard`); and
the fast path (`dispatcher.fast_path`, where it is built: ``attn-dispatch build-fast-path``), its
C++ entry point forwarding to the same no-op.

``--real-sdpa`` keeps PyTorch's own SDPA everywhere instead (the direct call, the floors, the warm
path, and the fast path, which then makes its own ATen call rather than forwarding the Python
call): what the fast path costs against PyTorch's whole call, its argument parser included, with
the kernel's address noise left in (session 13's HEAD: -1,111, -2,356, -131, -2,348 and +139
instructions on the five cases; docs/RESULTS.md section 19).

Usage (repository root; needs valgrind, takes ~3 minutes, mostly importing torch under it):
    python -m bench.diagnostics.warm_path_instructions [--calls 300] [--real-sdpa]
Another version of the package: put it first on PYTHONPATH (the child process imports it).
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

CASES = ("decode gqa, no mask", "prefill, no mask", "prefill, bool mask", "prefill, scale given", "strided, no mask")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The child runs as a module from here, so it imports `bench.dispatch_overhead`."""
WARM_UP = 60  # calls before counting: CPython's adaptive interpreter specialises the code first


def _inputs() -> dict[str, tuple]:
    """case -> (args, kwargs) of one tiny CPU call (as in `warm_path_tiny`)."""
    import torch

    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 4, 8)
    x = torch.randn(1, 2, 4, 8)
    strided = torch.randn(1, 4, 2, 8).transpose(1, 2)
    return dict(zip(CASES, [
        ((q, k, k.clone()), {"enable_gqa": True}),
        ((x, x.clone(), x.clone()), {}),
        ((x, x.clone(), x.clone(), torch.rand(4, 4) > 0.3), {}),
        ((x, x.clone(), x.clone()), {"scale": 0.3}),
        ((strided, strided.clone(), strided.clone()), {}),
    ], strict=True))


def child(calls: int, order_file: str, real_sdpa: bool) -> None:
    """Runs under callgrind: per case, the no-op called directly, the two floors, then
    `Dispatcher.attention` (warm, PyTorch's SDPA replaced by the no-op), one reduce each. Each case
    has a dispatcher of its own: its plan stays on the hot path (`hot_path.HOT_SLOTS` is less than
    the cases' plans), so no count includes a guard rebuilt or a call on the dict path."""
    import torch

    from attn_dispatch.dispatcher import Dispatcher, core
    from bench.dispatch_overhead import floor_calls

    target = torch._C._nn.scaled_dot_product_attention if real_sdpa else NO_OP

    torch.set_num_threads(1)
    runs = []
    with torch.inference_mode():
        cases = _inputs()
        dispatchers = {case: Dispatcher(kernels=["sdpa_default"]) for case in cases}
        fast = {}  # case -> the dispatcher's fast callable, forwarding to the no-op (its plan goes hot in the warm-up)
        for case, ours in dispatchers.items():
            if ours._fast is not None:
                ours._fast.call = fast[case] = ours._fast.module.make(target, ours.attention, torch.compiler, real_sdpa)
        for case, (args, kwargs) in cases.items():
            dispatchers[case].attention(*args, **kwargs)  # planned with PyTorch's SDPA, before it is replaced
        core._sdpa = target
        for case, (args, kwargs) in cases.items():
            runs.append((f"{case}: no-op", _caller(target, args, kwargs)))
            pass_through, guarded = floor_calls(target, args)
            runs.append((f"{case}: pass-through", _caller(pass_through, args, kwargs)))
            runs.append((f"{case}: pass-through + guard", _caller(guarded, args, kwargs)))
            runs.append((f"{case}: attention", _caller(dispatchers[case].attention, args, kwargs)))
            if case in fast:
                runs.append((f"{case}: fast", _caller(fast[case], args, kwargs)))
        for _, call in runs:
            for _ in range(WARM_UP):
                call()
        with open(order_file, "w") as handle:
            json.dump([label for label, _ in runs], handle)
        for _, call in runs:
            functools.reduce(lambda _, __, c=call: c(), range(calls), None)


NO_OP = "".format
"""Takes any positional and keyword arguments and returns at once, as a C function called the way
PyTorch's SDPA is (``METH_VARARGS | METH_KEYWORDS``)."""


def _caller(function, args: tuple, kwargs: dict):
    """``function(*args, **kwargs)`` spelled out as a caller writes it (a star call costs more)."""
    if len(args) == 4:
        return lambda: function(args[0], args[1], args[2], args[3], **kwargs)
    if "enable_gqa" in kwargs:
        return lambda: function(args[0], args[1], args[2], enable_gqa=True)
    if "scale" in kwargs:
        return lambda: function(args[0], args[1], args[2], scale=kwargs["scale"])
    return lambda: function(args[0], args[1], args[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--real-sdpa", action="store_true", help="keep PyTorch's SDPA (module docstring)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.calls, args.child, args.real_sdpa)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as folder:
        order = os.path.join(folder, "order.json")
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
                        "--dump-after=functools_reduce", f"--callgrind-out-file={folder}/cg.out", sys.executable,
                        "-m", __spec__.name, "--calls", str(args.calls), "--child", order,
                        *(["--real-sdpa"] if args.real_sdpa else [])],
                       check=True, capture_output=True, cwd=REPOSITORY)
        labels = json.load(open(order))
        dumps = sorted(glob.glob(f"{folder}/cg.out.*"), key=lambda path: int(path.rsplit(".", 1)[1]))
        totals = [_total(path) for path in dumps][-len(labels):]  # torch's import calls reduce too
    per_call = {label: total / args.calls for label, total in zip(labels, totals, strict=True)}
    sdpa = "PyTorch's own SDPA ('no-op' below: that SDPA)" if args.real_sdpa else "PyTorch's SDPA replaced by a no-op"
    print(f"instructions per call ({args.calls} calls, callgrind; {sdpa})")
    print(f"{'':22s} {'no-op':>7s}  {'attention':>9s}  over the no-op: {'dispatcher':>10s} {'floor: pass-through':>19s}"
          f" {'+ guard':>7s} {'fast path':>9s}")
    for case in CASES:
        direct, ours = per_call[f"{case}: no-op"], per_call[f"{case}: attention"]
        through, guarded = per_call[f"{case}: pass-through"], per_call[f"{case}: pass-through + guard"]
        fast = per_call.get(f"{case}: fast")
        print(f"{case:22s} {direct:7.0f}  {ours:9.0f}  {'':15s} {ours - direct:+10.0f} {through - direct:+19.0f}"
              f" {guarded - direct:+7.0f} {'(not built)' if fast is None else format(fast - direct, '+9.0f')}")


def _total(path: str) -> int:
    with open(path) as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(("summary:", "totals:")))


if __name__ == "__main__":
    main()
