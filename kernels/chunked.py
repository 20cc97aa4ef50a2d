"""`chunked[q=Qc,kv=Kc]`: query chunks times key/value chunks merged with an online softmax: peak extra memory O(Qc x
Kc) per head whatever the lengths. Causal blocks above the diagonal are skipped; when one key block covers every key,
each query block is one pass with PyTorch's fused softmax."""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import (
    HALF_DTYPES,
    OnlineSoftmax,
    accumulation_dtype,
    accumulation_itemsize,
    block_scores,
    block_workspace_bytes,
    fp32_product,
    fully_blocked_by_causality,
    mask_scores_,
    query_rows,
    scatter_rows,
    score_keys,
    score_keys_bytes,
    score_recipe,
    softmax_partials,
)
from attn_dispatch.kernels._layout import canonicalisation_bytes
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class ChunkedKernel(Kernel):
    """Flash-attention's tiling in plain PyTorch ops: `q` query and `kv` key positions per block."""

    family = "chunked"
    supports_backward = True  # FlashAttention-2's backward: `kernels.chunked`
    PARAM_SPACE = {"q": [64, 128, 256, 512, 1024, 2048, 4096], "kv": [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]}

    def __init__(self, q: int = 512, kv: int = 4096) -> None:
        self.q_chunk = _positive_int("q (query chunk)", q)
        self.kv_chunk = _positive_int("kv (key/value chunk)", kv)

    @property
    def params(self) -> dict[str, object]:
        return {"q": self.q_chunk, "kv": self.kv_chunk}

    def workspace_bytes(self, problem: Problem) -> int:
        q_rows = min(self.q_chunk, problem.q_len)
        if self.kv_chunk >= problem.kv_len:
            block = single_pass_workspace_bytes(problem, q_rows, splits=1)
        else:
            block = block_workspace_bytes(problem, q_rows, self.kv_chunk)
        return problem.out_bytes + self.input_copy_bytes(problem) + block + score_keys_bytes(problem)

    def backward_workspace_bytes(self, problem: Problem) -> int:
        """Extra peak memory of forward plus backward of one call (the training route's bound)."""
        return training_workspace_bytes(problem, self.q_chunk, self.kv_chunk)

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        if needs_backward(query, key, value):
            return chunked_attention_with_backward(query, key, value, mask, problem, scale, self.q_chunk, self.kv_chunk)
        L, S = problem.q_len, problem.kv_len
        out = query.new_empty(problem.batch, problem.q_heads, L, problem.value_dim)
        one_kv_block = self.kv_chunk >= S
        recipe = score_recipe(query.dtype, query.device, scale)  # fp32 scores: no fp16 overflow
        score_key = score_keys(key, recipe.operand)
        for q_start in range(0, L, self.q_chunk):
            rows = slice(q_start, min(L, q_start + self.q_chunk))
            q_block = query_rows(query, rows, problem, recipe.query_scale, recipe.operand)
            if one_kv_block:  # no online merge needed: PyTorch's fused softmax, one pass
                block = single_pass_attention(q_block, score_key, value, mask, rows, problem, score_scale=recipe.score_scale)
                scatter_rows(out, block, rows, problem)
                continue
            state = OnlineSoftmax()
            for kv_start in range(0, S, self.kv_chunk):
                cols = slice(kv_start, min(S, kv_start + self.kv_chunk))
                if problem.causal and fully_blocked_by_causality(rows, cols, problem.causal_offset):
                    break
                scores = block_scores(q_block, score_key[:, :, cols], recipe.score_scale)
                mask_scores_(scores, mask, problem.causal, rows, cols, problem)
                state.update(*softmax_partials(scores, value[:, :, cols]))
                del scores  # free this block before the next one is allocated
            if state.out is None:  # every key lies after these queries (bottom-right causal, L > S)
                out[:, :, rows] = 0
                continue
            scatter_rows(out, state.result(query.dtype), rows, problem)
        return out


_safe_softmax = getattr(torch.ops.aten, "_safe_softmax", None)  # PyTorch >= 2.5


# single pass: query rows against all keys with PyTorch's fused softmax (`small_q`; `chunked` with one key block)


def softmax_rows(scores: torch.Tensor, may_have_dead_rows: bool) -> torch.Tensor:
    """Softmax over the last dim (fp32 accumulation); all -inf rows give zeros when `may_have_dead_rows`."""
    if not may_have_dead_rows:
        return torch.softmax(scores, dim=-1)
    if _safe_softmax is not None:
        return _safe_softmax(scores, -1)
    probs = torch.softmax(scores, dim=-1)
    return probs.masked_fill_((scores == float("-inf")).all(dim=-1, keepdim=True), 0.0)


def _batched(tensor: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, n, m]`` -> ``[B * Hkv, n, m]`` (a view when the strides allow, as in `torch.matmul`)."""
    return tensor.reshape(-1, *tensor.shape[-2:])


def row_major_scores(rows: torch.Tensor, key: torch.Tensor, score_scale: float = 1.0) -> torch.Tensor:
    """``score_scale * rows [B, Hkv, R, E] @ key [B, Hkv, S, E]^T`` in fp32 (fp64 for fp64): a ``[B * Hkv, R, S]``
    view of a contiguous ``[R, B * Hkv, S]`` buffer, so each score row is contiguous for the softmax and
    `split_kv_product` reads key blocks in place."""
    R, S = rows.shape[-2], key.shape[-2]
    heads = rows.shape[0] * rows.shape[1]
    buffer = torch.empty(R, heads, S, dtype=accumulation_dtype(rows.dtype), device=rows.device)
    scores = buffer.transpose(0, 1)  # [B*Hkv, R, S], strides (S, B*Hkv*S, 1)
    if rows.dtype in HALF_DTYPES:
        return fp32_product(_batched(rows), _batched(key).transpose(1, 2), scores, score_scale)
    torch.bmm(_batched(rows), _batched(key).transpose(1, 2), out=scores)
    return scores if score_scale == 1.0 else scores.mul_(score_scale)


def split_kv_product(probs: torch.Tensor, value: torch.Tensor, splits: int) -> torch.Tensor:
    """``probs [B*Hkv, R, S]`` (from `row_major_scores`) ``@ value [B, Hkv, S, Ev]`` as `splits` reductions of ``S /
    splits`` keys (split-K; `splits` must divide S), summed in fp32. Returns ``[B*Hkv, R, Ev]`` in the value dtype."""
    values = _batched(value)
    if splits == 1:
        return torch.bmm(probs, values)
    heads, R, S = probs.shape
    chunk = S // splits
    # (head, split) pairs sit at a constant stride `chunk` in the row-outermost buffer: no copy.
    per_split = probs.transpose(0, 1).reshape(R, heads * splits, chunk).transpose(0, 1)  # [B*Hkv*P, R, C]
    partial = torch.bmm(per_split, values.reshape(heads * splits, chunk, -1))  # [B*Hkv*P, R, Ev]
    return partial.view(heads, splits, R, -1).sum(dim=1)  # reductions accumulate in fp32


def single_pass_attention(rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                          q_positions: slice, problem: Problem, splits: int = 1, score_scale: float = 1.0,
                          ) -> torch.Tensor:
    """Query rows ``[B, Hkv, G*Lc, E]`` at `q_positions` (scores times `score_scale`) against every key (``[B, Hkv,
    S, E]`` in the rows' dtype, `_blocks.score_keys`); mask ``[B|1, Hq|1, L|1, S|1]`` or None. Returns ``[B, Hkv,
    G*Lc, Ev]`` in the value dtype."""
    scores = row_major_scores(rows, key, score_scale)  # [B*Hkv, R, S]
    mask_scores_(scores.view(rows.shape[:-1] + (problem.kv_len,)), mask, problem.causal, q_positions,
                 slice(0, problem.kv_len), problem)
    # Softmax on the contiguous buffer (on the transposed view it would copy first).
    probs = softmax_rows(scores.transpose(0, 1), may_have_dead_rows=mask is not None or problem.causal_offset < 0)
    del scores
    probs = probs.to(value.dtype).transpose(0, 1)  # keeps the row-outermost layout
    return split_kv_product(probs, value, splits).view(rows.shape[:-1] + (value.shape[-1],))


def single_pass_workspace_bytes(problem: Problem, q_rows: int, splits: int) -> int:
    """Peak extra bytes of `single_pass_attention` for `q_rows` rows (keys' fp32 copy: the caller's)."""
    item, acc = problem.itemsize, (8 if problem.dtype == "float64" else 4)
    rows = problem.batch * problem.q_heads * q_rows
    scores = rows * problem.kv_len
    extra = rows * problem.head_dim * acc + scores * (2 * acc + (item if item < acc else 0))
    if problem.mask_kind != "none":
        extra += scores * (acc + 1)  # `_safe_softmax`'s all-blocked test
    if problem.mask_kind == "bool":
        extra += scores  # the inverted mask block (at most one byte per score)
    if problem.causal:
        extra += q_rows * problem.kv_len * 2
    if splits > 1:
        extra += rows * problem.value_dim * splits * item
    return extra + rows * problem.value_dim * item


# FlashAttention-2's backward in PyTorch ops, memory O(block): the forward keeps each query row's
# log-sum-exp (``lse [B, Hkv, G, L]``, fp32); the backward recomputes each score tile, takes
# P = exp(S - lse) and accumulates dV += P^T dO, dS = P * (dP - rowsum(dO * O)), dQ += dS K * scale,
# dK += dS^T (Q * scale) in fp32, per GQA group. Fully blocked rows get lse = +inf (zero gradients);
# a mask requiring grad is refused (the dispatcher routes such calls to PyTorch's SDPA).


def needs_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Grad is enabled and query, key or value requires it."""
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


def scores_fp32(q_rows: torch.Tensor, key_block: torch.Tensor) -> torch.Tensor:
    """``q_rows [B, Hkv, R, E] @ key_block^T`` -> fp32 (fp64 for fp64) scores; fp16 multiplied in fp32 (its products
    overflow), bf16 in bf16 then widened."""
    if q_rows.dtype == torch.float16:
        return torch.matmul(q_rows.float(), key_block.float().transpose(-1, -2))
    return torch.matmul(q_rows, key_block.transpose(-1, -2)).to(accumulation_dtype(q_rows.dtype))


def _grouped_rows(tensor: torch.Tensor, rows: slice, problem: Problem) -> torch.Tensor:
    """``tensor [B, Hq, L, X]`` at positions `rows` -> ``[B, Hkv, G * Lc, X]`` (contiguous)."""
    whole = rows.start == 0 and rows.stop >= tensor.shape[2]
    block = tensor if whole else tensor[:, :, rows]  # a full-length slice is an alias, which vmap cannot batch
    if not block.is_contiguous():
        block = block.contiguous()
    return block.reshape(problem.batch, problem.kv_heads, -1, block.shape[-1])


def _keys(tensor: torch.Tensor, cols: slice) -> torch.Tensor:
    """``tensor`` at key positions `cols`: itself for all of them (vmap cannot batch a full alias), else a view."""
    return tensor if cols.start == 0 and cols.stop >= tensor.shape[2] else tensor[:, :, cols]


def _kv_blocks(rows: slice, problem: Problem, kv_chunk: int):
    """Key blocks a query block reads (causal: up to the last one any of its rows sees, `Problem.causal_offset`)."""
    for kv_start in range(0, problem.kv_len, kv_chunk):
        cols = slice(kv_start, min(problem.kv_len, kv_start + kv_chunk))
        if problem.causal and fully_blocked_by_causality(rows, cols, problem.causal_offset):
            return
        yield cols


def _forward_with_lse(query, key, value, mask, problem: Problem, scale: float, q_chunk: int, kv_chunk: int):
    """Canonical inputs -> (out ``[B, Hq, L, Ev]``, lse ``[B, Hkv, G, L]`` fp32, +inf on fully blocked rows)."""
    B, Hkv, G, L = problem.batch, problem.kv_heads, problem.gqa_ratio, problem.q_len
    out = query.new_empty(B, problem.q_heads, L, problem.value_dim)
    lse = torch.empty(B, Hkv, G, L, dtype=accumulation_dtype(query.dtype), device=query.device)
    for q_start in range(0, L, q_chunk):
        rows = slice(q_start, min(L, q_start + q_chunk))
        q_block = query_rows(query, rows, problem, scale)
        state = OnlineSoftmax()
        for cols in _kv_blocks(rows, problem, kv_chunk):
            scores = scores_fp32(q_block, key[:, :, cols])
            mask_scores_(scores, mask, problem.causal, rows, cols, problem)
            state.update(*softmax_partials(scores, value[:, :, cols]))
            del scores
        row_lse = state.row_sum.log().add_(state.row_max)  # -inf + log(0) on dead rows
        row_lse.masked_fill_(state.row_sum == 0, float("inf"))
        lse[:, :, :, rows] = row_lse.view(B, Hkv, G, -1)
        scatter_rows(out, state.result(query.dtype), rows, problem)
    return out, lse


def _backward(grad_out, query, key, value, mask, out, lse, problem: Problem, scale: float,
              q_chunk: int, kv_chunk: int):
    """Gradients of canonical query, key, value (input dtype, shapes as the inputs)."""
    B, Hkv, L, dtype = problem.batch, problem.kv_heads, problem.q_len, query.dtype
    acc = accumulation_dtype(dtype)
    # Buffers made from `grad_out`: under vmap (batched gradients: gradcheck's check_batched_grad,
    # jacobians) they are batched like it, so the in-place accumulation below stays possible.
    d_query = grad_out.new_empty(B, problem.q_heads, L, problem.head_dim, dtype=dtype)
    d_key = grad_out.new_zeros(key.shape, dtype=acc)
    d_value = grad_out.new_zeros(value.shape, dtype=acc)
    for q_start in range(0, L, q_chunk):
        rows = slice(q_start, min(L, q_start + q_chunk))
        q_block = query_rows(query, rows, problem, scale)  # [B, Hkv, R, E], scaled
        do_block = _grouped_rows(grad_out, rows, problem)  # [B, Hkv, R, Ev]
        delta = (do_block.to(acc) * _grouped_rows(out, rows, problem).to(acc)).sum(dim=-1, keepdim=True)
        row_lse = lse[:, :, :, rows].reshape(B, Hkv, -1, 1)
        dq_block = grad_out.new_zeros(q_block.shape, dtype=acc)
        for cols in _kv_blocks(rows, problem, kv_chunk):
            key_block, value_block = _keys(key, cols), _keys(value, cols)
            probs = scores_fp32(q_block, key_block)
            mask_scores_(probs, mask, problem.causal, rows, cols, problem)
            probs = probs.sub_(row_lse).exp_()  # P = exp(S - lse), in place
            _keys(d_value, cols).add_(torch.matmul(probs.to(dtype).transpose(-1, -2), do_block))
            d_probs = torch.sub(torch.matmul(do_block, value_block.transpose(-1, -2)), delta)  # fp32: dP - delta
            d_scores = d_probs.mul_(probs).to(dtype)  # dS = P * (dP - delta), into dP: batched under vmap
            del probs, d_probs
            dq_block += torch.matmul(d_scores, key_block)
            _keys(d_key, cols).add_(torch.matmul(d_scores.transpose(-1, -2), q_block))
            del d_scores
        scatter_rows(d_query, dq_block.mul_(scale).to(dtype), rows, problem)
    return d_query, d_key.to(dtype), d_value.to(dtype)


class _ChunkedAttention(torch.autograd.Function):
    """Chunked attention with FlashAttention-2's backward (comment above `needs_backward`)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, problem, scale, q_chunk, kv_chunk):
        out, lse = _forward_with_lse(query, key, value, mask, problem, scale, q_chunk, kv_chunk)
        ctx.save_for_backward(query, key, value, mask, out, lse)
        ctx.config = (problem, scale, q_chunk, kv_chunk)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, mask, out, lse = ctx.saved_tensors
        d_query, d_key, d_value = _backward(grad_out, query, key, value, mask, out, lse, *ctx.config)
        return d_query, d_key, d_value, None, None, None, None, None


def chunked_attention_with_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                    mask: torch.Tensor | None, problem: Problem, scale: float, q_chunk: int,
                                    kv_chunk: int) -> torch.Tensor:
    """`chunked` on canonical inputs, differentiable in query, key and value; returns ``[B, Hq, L, Ev]``. Raises
    RuntimeError for a mask that requires grad (it would silently get none)."""
    if mask is not None and mask.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("attn_mask requires grad, and chunked's backward gives the mask no gradient: "
                           "call PyTorch's scaled_dot_product_attention for a learned mask (the dispatcher "
                           "does so)")
    return _ChunkedAttention.apply(query, key, value, mask, problem, scale, q_chunk, kv_chunk)


def _tile_bytes(problem: Problem, q_rows: int, kv_cols: int) -> tuple[int, int]:
    """(forward, backward) peak bytes of one tile step's temporaries (`_forward_with_lse`, `_backward`)."""
    item, acc = problem.itemsize, accumulation_itemsize(problem)
    half = item < acc
    rows = problem.batch * problem.q_heads * q_rows  # score rows across heads
    cols = problem.batch * problem.kv_heads * kv_cols  # key rows across key/value heads
    tile = rows * kv_cols
    E, Ev = problem.head_dim, problem.value_dim
    widen = half and problem.dtype == "float16"  # fp32 copies of the fp16 query and key blocks
    mask_elem = int(problem.causal) + int(problem.mask_kind == "bool")
    # scores: the product in the input dtype (bf16) and fp32, or fp32 from fp32 copies (fp16)
    score_elem = acc + (item if half else 0) + mask_elem
    per_row = E * item + (E * acc if widen else 0) + 6 * acc  # scaled query rows, row statistics
    per_col = (E * acc if widen else 0) + (E + Ev) * item  # widened key block, matmul input copies
    casts = item if half else 0  # a cast to the input dtype copies only for half inputs
    forward = tile * (score_elem + casts) + rows * (per_row + Ev * (item + 2 * acc)) + cols * per_col
    # backward: P (fp32) and its cast, dP in the input dtype and fp32, dS's cast; dO, O and their
    # fp32 copies, delta, lse rows, dQ's fp32 accumulator, product and cast; dK and dV products
    backward = (
        tile * (score_elem + acc + 3 * casts)
        + rows * (per_row + Ev * 2 * (item + acc) + 2 * acc + E * (2 * acc + 2 * item))
        + cols * (per_col + (E + Ev) * item)
    )
    return forward, backward


def training_workspace_bytes(problem: Problem, q_chunk: int, kv_chunk: int) -> int:
    """Upper bound of forward-plus-backward extra peak memory of one call, never allocating: the larger of the
    forward's and the backward's (saved output, lse, copies, gradients, fp32 accumulators, one tile)."""
    q_rows, kv_cols = min(q_chunk, problem.q_len), min(kv_chunk, problem.kv_len)
    forward_tile, backward_tile = _tile_bytes(problem, q_rows, kv_cols)
    acc = accumulation_itemsize(problem)
    lse = problem.batch * problem.q_heads * problem.q_len * acc
    copies = canonicalisation_bytes(problem)
    saved = problem.out_bytes + lse + copies
    grads = problem.q_bytes + problem.kv_bytes
    accumulators = problem.kv_bytes * acc // problem.itemsize if problem.itemsize < acc else 0
    forward = saved + forward_tile
    backward = saved + copies + grads + accumulators + backward_tile
    return max(forward, backward)
