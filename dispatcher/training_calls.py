"""The training route's calls (forward+backward: inputs needing a gradient, or dropout): a kernel
with a backward chosen by `training_route.TrainingRoute`, else PyTorch's own SDPA as given
(`TrainingCalls`, a base class of `core.Dispatcher`)."""

from __future__ import annotations

from attn_dispatch.dispatcher import _log, sdpa_context
from attn_dispatch.dispatcher.decision import TRAINING_KERNEL
from attn_dispatch.dispatcher.dual_calls import carries_tangent
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa

TRAINING_COUNT = f"{TRAINING_KERNEL} (training)"
"""`stats` key of calls that went to PyTorch's SDPA on the training route."""


class TrainingCalls:
    """`Dispatcher.attention`'s training route (it uses the dispatcher's plans, counts and route)."""

    def _training(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_):
        if query.is_meta:  # as in `attention`: PyTorch's SDPA, no plan
            return sdpa_context.pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                  enable_gqa)
        if dropout_p == 0.0 and not (attn_mask is not None and attn_mask.requires_grad):
            plan = self._plans.get(key_)
            if plan is None or plan.recheck:
                plan = self._plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
            choice = self._training_route.choose(plan, self.memory_budget)
            if choice.kernel is not None:
                count = self._count_cell(choice.kernel.name)
                count[0] += 1
                try:
                    return choice.kernel.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
                except Exception as error:  # noqa: BLE001 - remembered; PyTorch's SDPA runs this call
                    count[0] -= 1
                    if not carries_tangent(query, key, value, attn_mask):  # a dual's failure: not the kernel's
                        self._training_route.failed(plan, self.memory_budget, choice.kernel, error)
                        _log.fallback(choice.kernel.name, error, TRAINING_KERNEL)
        return self._pytorch_training(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _pytorch_training(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """PyTorch's own SDPA, arguments unchanged (autograd and dropout as PyTorch does them)."""
        self._count_cell(TRAINING_COUNT)[0] += 1
        gqa = {"enable_gqa": True} if enable_gqa else {}
        return pytorch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa)
