"""`attn-dispatch explain`: which kernel the dispatcher runs for a problem shape, and why."""

from __future__ import annotations

import argparse
import json
import logging
from contextlib import contextmanager

from attn_dispatch.dispatcher.commands._common import CommandError, one_line, resolve_device

NAME = "explain"
HELP = "show the kernel chosen for a problem shape, every candidate's predicted time and why others were dropped"


# PyTorch's own aliases of the dtypes attention takes (``torch.half`` is ``torch.float16``).
TORCH_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}


def dtype_name(text: str) -> str:
    """An argparse type: a dtype as PyTorch users write it (``float16``, ``fp16``, ``half``, ``torch.float16``, any
    case) -> its long name."""
    from attn_dispatch.kernels.accuracy import LONG_DTYPE_NAMES

    name = text.strip().lower().removeprefix("torch.")
    name = LONG_DTYPE_NAMES.get(name, TORCH_DTYPE_ALIASES.get(name, name))
    if name not in LONG_DTYPE_NAMES.values():
        raise argparse.ArgumentTypeError(f"{text!r} is not a dtype attention takes: use float16 (fp16, half), "
                                         "bfloat16 (bf16), float32 (fp32, float) or float64 (fp64, double)")
    return name


def size(text: str) -> int:
    """An argparse type: a size of 0 or more (argparse names the flag in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    from attn_dispatch.dispatcher.core import KERNEL_SETS
    from attn_dispatch.kernels.problem import MASK_KINDS

    parser = subparsers.add_parser(NAME, help=HELP, description="Decide, without running anything, which "
                                   "kernel attention of this shape would use on this device: the chosen "
                                   "kernel, predicted time of every candidate, the reason each other kernel "
                                   "was dropped, and which table (or prior) served the decision. A CPU "
                                   "table timed with another torch thread count than this process runs says "
                                   "so in a note.")
    parser.add_argument("--lq", type=size, required=True, help="query length (1 for decode)")
    parser.add_argument("--lk", type=size, default=None, help="key/value length (default: --lq)")
    parser.add_argument("--batch", type=size, default=1, help="batch size (default: 1)")
    parser.add_argument("--heads", type=size, default=32, help="query heads (default: 32)")
    parser.add_argument("--kv-heads", type=size, default=None, help="key/value heads (GQA; default: --heads)")
    parser.add_argument("--head-dim", type=size, default=128, help="query/key head dim (default: 128)")
    parser.add_argument("--value-dim", type=size, default=None, help="value head dim (default: --head-dim)")
    parser.add_argument("--dtype", default=None, type=dtype_name,
                        help="input dtype: float16, bfloat16, float32 or float64, or fp16, half, torch.float16, ... "
                        "(default: float32 on a CPU, float16 on a GPU)")
    parser.add_argument("--causal", action="store_true", help="causal attention, is_causal=True (default: not causal)")
    parser.add_argument("--mask", default="none", choices=MASK_KINDS, help="attention mask kind, shape [B, 1, Lq, Lk] (default: none)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--memory-budget", default=None, help="workspace cap, e.g. 16GiB (default: ATTN_DISPATCH_MEMORY_BUDGET, else free memory only)")
    parser.add_argument("--kernels", default="all", choices=KERNEL_SETS, help="kernel set: every kernel, or those that run without PyTorch's fused backends, as on gfx906 (default: all)")
    parser.add_argument("--allow-lossy", action="append", default=[], metavar="CONVERSION",
                        help="accept a lossy conversion, e.g. fp32->bf16 (repeatable; 'any' for all; default: none, lossless only)")
    parser.add_argument("--table", default=None, metavar="FILE",
                        help="explain the decision this table file makes (as `show` and `check` read it; default: the "
                        "table this device's lookup finds)")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON (default: as text)")
    parser.set_defaults(run=run)


def given_table(path: str):
    """The table file of ``--table`` (read as `show` and `check` read theirs); a `CommandError`
    naming ``--table`` and the file when it is not a readable table."""
    from attn_dispatch.dispatcher.commands.show import resolve_table

    try:
        return resolve_table(path, None, NAME)[0]
    except CommandError as error:
        raise CommandError(f"--table {error}") from None


@contextmanager
def _notice_in_output_only():
    """The no-table notice is one of the decision's notes: not logged again on stderr."""
    from attn_dispatch.dispatcher.device_ranking import NO_TABLE_NOTICE, logger

    def not_the_notice(record: logging.LogRecord) -> bool:
        return not getattr(record, NO_TABLE_NOTICE, False)

    logger.addFilter(not_the_notice)
    try:
        yield
    finally:
        logger.removeFilter(not_the_notice)


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.dispatcher.core import Dispatcher
    from attn_dispatch.dispatcher.decision import BUDGET_FIX, NoKernelError, parse_memory_size
    from attn_dispatch.kernels import AccuracyPolicy

    try:
        table = None if args.table is None else given_table(args.table)
        device = resolve_device(args.device)
        problem = problem_from_args(args, device.type)
        policy = AccuracyPolicy.allowing(*args.allow_lossy) if args.allow_lossy else AccuracyPolicy()
        budget = None if args.memory_budget is None else parse_memory_size(args.memory_budget, name="--memory-budget")
        dispatcher = Dispatcher(kernels=args.kernels, policy=policy, memory_budget=budget)
        if table is not None:
            dispatcher.use_table(table, args.table)
        with _notice_in_output_only():
            decision = dispatcher.decide(problem, device=device)
    except NoKernelError as error:
        raise CommandError(error.cause.replace(BUDGET_FIX, "raise --memory-budget")) from None
    except (ValueError, RuntimeError) as error:
        raise CommandError(one_line(error)) from None
    print(json.dumps(decision.to_dict(), indent=1) if args.json else decision)
    return 0


def problem_from_args(args: argparse.Namespace, device_type: str):
    """The `Problem` the arguments describe on a `device_type` device (ValueError naming the bad
    option otherwise)."""
    from attn_dispatch.kernels import Problem
    kv_len = args.lq if args.lk is None else args.lk
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    if kv_heads < 1 or args.heads % kv_heads:
        raise ValueError(f"--kv-heads ({kv_heads}) must divide --heads ({args.heads})")
    dtype = args.dtype or ("float32" if device_type == "cpu" else "float16")
    mask_shape = () if args.mask == "none" else (args.batch, 1, args.lq, kv_len)
    return Problem(batch=args.batch, q_heads=args.heads, kv_heads=kv_heads, q_len=args.lq, kv_len=kv_len,
                   head_dim=args.head_dim, value_dim=args.value_dim or args.head_dim, dtype=dtype,
                   causal=args.causal, mask_kind=args.mask, mask_shape=mask_shape, device_type=device_type)
