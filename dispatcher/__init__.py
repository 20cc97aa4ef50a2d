"""dispatcher: what decides at run time (lookup, memory fit, fallback, explain, patching, CLI).

Public API
----------
attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
    enable_gqa=False)
    `F.scaled_dot_product_attention`, run by the fastest kernel that fits in memory.
explain(...) -> Decision
    The decision for those arguments: kernel, predicted times, why each other kernel was dropped.
stats() -> dict[str, int]; reset()
patched(), install(), uninstall()
    Route every `F.scaled_dot_product_attention` call through a dispatcher.
register_transformers()
    ``attn_implementation="attn_dispatch"`` in Hugging Face transformers.
Dispatcher(*, kernels, policy, memory_budget, home)
    A dispatcher of your own (kernel set, accuracy policy, memory budget, table directory).
record(path)
    Context manager: write the problem buckets the dispatcher meets to `path` (JSON Lines) for
    ``attn-dispatch calibrate --workload path`` (or set ``ATTN_DISPATCH_RECORD=path``).
AccuracyPolicy, LOSSLESS
    Which lossy conversions (e.g. fp32 -> bf16) a dispatcher may use; LOSSLESS allows none.

Import it as ``attn_dispatch`` (``import attn_dispatch as ad``), which re-exports all of this.
"""

from __future__ import annotations

import importlib

# Where each public name lives. Imported on first use (PEP 562), so that `attn-dispatch --help`
# and `attn_dispatch.dispatcher.cli` do not pay for torch and scikit-learn.
_PUBLIC = {
    "attention": "api", "explain": "api", "stats": "api", "reset": "api", "default_dispatcher": "api",
    "Dispatcher": "core", "Decision": "decision", "Candidate": "decision", "RankingSource": "decision",
    "NoKernelError": "decision", "register_transformers": "hf", "free_bytes": "decision",
    "parse_memory_size": "decision", "install": "patching", "uninstall": "patching", "patched": "patching",
    "is_installed": "patching", "TableWarning": "device_ranking", "record": "recording", "PreparedAttention": "plans",
}
_KERNELS = {"AccuracyPolicy": "attn_dispatch.kernels.accuracy", "LOSSLESS": "attn_dispatch.kernels.accuracy"}

__all__ = [
    "attention", "explain", "stats", "reset", "default_dispatcher", "Dispatcher", "Decision",
    "Candidate", "RankingSource", "NoKernelError", "register_transformers", "free_bytes",
    "parse_memory_size", "install", "uninstall", "patched", "is_installed", "TableWarning",
    "AccuracyPolicy", "LOSSLESS", "record", "PreparedAttention",
]


def __getattr__(name: str):
    if name in _PUBLIC:
        module = importlib.import_module(f"{__name__}.{_PUBLIC[name]}")
    elif name in _KERNELS:
        module = importlib.import_module(_KERNELS[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
