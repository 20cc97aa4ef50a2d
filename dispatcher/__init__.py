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

from attn_dispatch.kernels.accuracy import LOSSLESS, AccuracyPolicy
from attn_dispatch.dispatcher.api import attention, default_dispatcher, explain, reset, stats
from attn_dispatch.dispatcher.core import Dispatcher
from attn_dispatch.dispatcher.decision import Candidate, Decision, RankingSource
from attn_dispatch.dispatcher.errors import NoKernelError
from attn_dispatch.dispatcher.hf import register_transformers
from attn_dispatch.dispatcher.memory import free_bytes, parse_memory_size
from attn_dispatch.dispatcher.patching import install, is_installed, patched, uninstall
from attn_dispatch.dispatcher.ranking import TableWarning
from attn_dispatch.dispatcher.recording import record

__all__ = [
    "attention", "explain", "stats", "reset", "default_dispatcher", "Dispatcher", "Decision",
    "Candidate", "RankingSource", "NoKernelError", "register_transformers", "free_bytes",
    "parse_memory_size", "install", "uninstall", "patched", "is_installed", "TableWarning",
    "AccuracyPolicy", "LOSSLESS", "record",
]
