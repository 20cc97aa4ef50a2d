"""Hugging Face transformers integration: ``attn_implementation="attn_dispatch"``. `register_transformers()` adds our
function to transformers' `AttentionInterface` (and SDPA's mask builder under the same name). The function mirrors
transformers' ``sdpa_attention_forward`` (causal rules, static-cache slicing, position-bias masks) but always passes
GQA as ``enable_gqa``. transformers is imported only when called."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.core import Dispatcher

IMPLEMENTATION_NAME = "attn_dispatch"
# The first transformers release with `AttentionInterface`, the registry this integration plugs into.
MIN_TRANSFORMERS = "4.48"
logger = logging.getLogger("attn_dispatch")
_warned_output_attentions = False


def make_attention_function(dispatcher: Dispatcher | None = None):
    """A transformers attention function calling `dispatcher` (default: the module's)."""
    if dispatcher is None:
        from attn_dispatch.dispatcher.api import default_dispatcher

        dispatcher = default_dispatcher()
    # bound, not looked up per call: the fast path (`fast_path`) where built; an object with only `attention`, that
    run = getattr(dispatcher, "fast_attention", None) or dispatcher.attention

    def attn_dispatch_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                              scaling: float | None = None, is_causal: bool | None = None,
                              position_bias: torch.Tensor | None = None,
                              **kwargs) -> tuple[torch.Tensor, None]:
        """query ``[B, Hq, L, E]``, key/value ``[B, Hkv, S, E]``, mask ``[B, 1, L, S]`` (bool or
        float) or None -> (output ``[B, L, Hq, Ev]`` contiguous, None)."""
        if kwargs.get("softcap") is not None:
            raise ValueError("attn_implementation='attn_dispatch' does not support `softcap`; use 'eager' "
                             "or 'flex_attention' for models that need it")
        _warn_output_attentions(kwargs)
        q_length, kv_length = query.shape[2], key.shape[2]
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        is_causal = bool(q_length > 1 and attention_mask is None and is_causal)
        if is_causal and kv_length > q_length:  # prefill into an empty static cache
            key, value = key[:, :, :q_length], value[:, :, :q_length]
            if position_bias is not None:
                position_bias = position_bias[:, :, :, :q_length]
        if position_bias is not None:
            from transformers.integrations.sdpa_attention import create_position_bias_mask

            attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
            is_causal = False
        out = run(query, key, value, attention_mask, dropout, is_causal, scale=scaling,
                  enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None

    return attn_dispatch_forward


def _warn_output_attentions(kwargs: dict) -> None:
    global _warned_output_attentions
    if kwargs.get("output_attentions", False) and not _warned_output_attentions:
        _warned_output_attentions = True
        logger.warning("attn_dispatch does not return attention weights (output_attentions=True); use 'eager'")


def register_transformers(name: str = IMPLEMENTATION_NAME, *, dispatcher: Dispatcher | None = None) -> str:
    """Register ``attn_implementation=name`` with transformers; returns `name`. Raises ModuleNotFoundError without
    transformers, ImportError (as transformers raised it) when it predates `AttentionInterface` (4.48) or fails to
    import."""
    try:
        import transformers
    except ModuleNotFoundError as error:
        if error.name != "transformers":  # transformers is there but one of its own imports failed: show that
            raise
        raise ModuleNotFoundError(f"register_transformers() needs transformers >= {MIN_TRANSFORMERS}: pip "
                                  "install -U transformers", name="transformers") from error
    # transformers imports its submodules lazily: an import error inside it surfaces here, unchanged
    if not hasattr(transformers, "AttentionInterface"):
        raise ImportError(f"register_transformers() needs transformers >= {MIN_TRANSFORMERS} "
                          f"(AttentionInterface); transformers {transformers.__version__} is installed: pip "
                          "install -U transformers")
    transformers.AttentionInterface.register(name, make_attention_function(dispatcher))
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers build masks from the implementation name itself
        return name
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
