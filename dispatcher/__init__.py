"""dispatcher: what decides at run time (lookup, memory fit, fallback, explain, patching, CLI). Public API,
re-exported by ``attn_dispatch``: `attention`, `explain`, `stats`, `reset`, `patched` / `install` / `uninstall`,
`register_transformers`, `Dispatcher`, `record`, `AccuracyPolicy`, `LOSSLESS`."""

from __future__ import annotations

import importlib

# Where each public name lives, imported on first use (PEP 562): `attn-dispatch --help` imports no torch.
_PUBLIC = {
    name: f"attn_dispatch.dispatcher.{module}" for module, names in {
        "api": ("attention", "explain", "stats", "reset", "default_dispatcher"),
        "core": ("Dispatcher",), "hf": ("register_transformers",), "recording": ("record",),
        "decision": ("Decision", "Candidate", "RankingSource", "NoKernelError", "free_bytes", "parse_memory_size"),
        "patching": ("install", "uninstall", "patched", "is_installed"),
        "device_ranking": ("TableWarning",), "plans": ("PreparedAttention",),
    }.items() for name in names
} | {"AccuracyPolicy": "attn_dispatch.kernels.accuracy", "LOSSLESS": "attn_dispatch.kernels.accuracy"}

__all__ = ["attention", "explain", "stats", "reset", "default_dispatcher", "Dispatcher", "Decision",
           "Candidate", "RankingSource", "NoKernelError", "register_transformers", "free_bytes",
           "parse_memory_size", "install", "uninstall", "patched", "is_installed", "TableWarning",
           "AccuracyPolicy", "LOSSLESS", "record", "PreparedAttention"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
