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
    name: f"attn_dispatch.dispatcher.{module}" for module, names in {
        "api": ("attention", "explain", "stats", "reset", "default_dispatcher"),
        "core": ("Dispatcher",), "hf": ("register_transformers",), "recording": ("record",),
        "decision": ("Decision", "Candidate", "RankingSource", "NoKernelError", "free_bytes", "parse_memory_size"),
        "patching": ("install", "uninstall", "patched", "is_installed"),
        "device_ranking": ("TableWarning",), "plans": ("PreparedAttention",),
    }.items() for name in names
} | {"AccuracyPolicy": "attn_dispatch.kernels.accuracy", "LOSSLESS": "attn_dispatch.kernels.accuracy"}

__all__ = [
    "attention", "explain", "stats", "reset", "default_dispatcher", "Dispatcher", "Decision",
    "Candidate", "RankingSource", "NoKernelError", "register_transformers", "free_bytes",
    "parse_memory_size", "install", "uninstall", "patched", "is_installed", "TableWarning",
    "AccuracyPolicy", "LOSSLESS", "record", "PreparedAttention",
]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
