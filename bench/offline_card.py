"""What a card answered that a CPU cannot ask: fit and score a card's table off the card with the
card's own features.

`sdpa_default`'s workspace feature follows the backend PyTorch picks for a kind of problem
(`kernels.sdpa_default.default_backend_choice`), and a kernel is a candidate only where its probe
passed (`kernels.sdpa_default.probe_backend`). Off the card PyTorch cannot be asked: the choice falls
back to the math backend (a workspace ~the score matrix, so `sdpa_default` is ranked with other
features than on the card) and every probe "works". An `OfflineCard` records the card's answers so
that `assume_backends_available(card)` reproduces them.

H200, torch 2.11 (`H200_TORCH_2_11`), from recorded evidence:
- PyTorch's default backend: cuDNN for fp16/bf16 (every mask kind, GQA or not, decode or not);
  fp32: the memory-efficient backend, or the math backend with GQA (which that backend does not
  take). Timings (`bench/diagnostics/default_backend_evidence.py` at 4c94021, on the grid files of
  sessions 6-10): `sdpa_default` took within 3% of forced cuDNN's time on 1,114 of 1,584 half
  shapes without GQA and 824 of 1,948 with it (forced cuDNN folds the query heads into rows
  there, a different launch), flash's on 44 and efficient's on 18 of all 3,532; fp32 in run 6
  matched efficient (no GQA) or math (GQA). Fit: with these answers the offline
  refit of `bash bench/regenerate_h200_table.sh` reproduces the card's refit log of session 10 run 3
  line for line (margin 1.1x, 44 regions, 1,579 entries, held-out 1.035x/1.039x) and its embedded
  models, guard and measured entries exactly; assuming cuDNN for fp32 too does not (margin 1.05x,
  55 regions), nor does assuming efficient/math for masked half problems (table 1.030x).
- Probes: FlashAttention's causal probe with L != S fails (`causal_rect`: FA2 aligns the diagonal
  bottom-right, SDPA's ``is_causal`` is top-left); the bundled table lists flash in no L != S cell
  of its causal classes. With both, the offline refit's decision map equals the card's too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.identity import DeviceIdentity

HALF_DTYPES = ("float16", "bfloat16")
RECORDED_HEAD_DIM_MAX = 256
"""Largest head dim the recorded H200 measurements hold (grid: 64-256; run 6: 32-256)."""
RECORDED_HEAD_DIM_MULTIPLE = 8
"""Every recorded head dim is a multiple of 8 (the fused backends' alignment)."""


def h200_torch_2_11_default_backend(problem: Problem) -> str | None:
    """PyTorch 2.11's own backend choice on the H200 (see the module docstring for the evidence);
    None outside the recorded kinds (other head dims, value dim != head dim)."""
    if (problem.device_type != "cuda" or problem.head_dim != problem.value_dim
            or problem.head_dim > RECORDED_HEAD_DIM_MAX or problem.head_dim % RECORDED_HEAD_DIM_MULTIPLE):
        return None
    if problem.dtype in HALF_DTYPES:
        return "sdpa_cudnn"
    if problem.dtype == "float32":
        return "sdpa_math" if problem.gqa_ratio > 1 else "sdpa_efficient"
    return None


H200_FAILED_PROBES = {
    ("sdpa_flash", "causal_rect"): "sdpa_flash aligns the causal diagonal bottom-right when L != S "
                                   "(recorded on the H200: the bundled table ranks no flash there)",
}
"""(family, probe feature) -> why that probe failed on the H200, for every dtype."""


@dataclass(frozen=True)
class OfflineCard:
    """A card's recorded answers (`kernels.assumed_backends.AssumedCard`) and which tables they fit:
    identities whose device key starts with `device_key` and whose torch version starts with
    `torch_prefix`."""

    name: str
    device_key: str
    torch_prefix: str
    default_choice: Callable[[Problem], str | None]
    failed_probes: dict[tuple[str, str], str]

    def default_backend(self, problem: Problem) -> str | None:
        return self.default_choice(problem)

    def probe_failure(self, family: str, dtype: str, feature: str) -> str | None:
        return self.failed_probes.get((family, feature))

    def matches(self, identity: DeviceIdentity) -> bool:
        return identity.key.startswith(self.device_key) and identity.torch_version.startswith(self.torch_prefix)


H200_TORCH_2_11 = OfflineCard("H200, torch 2.11", "nvidia-h200", "2.11.", h200_torch_2_11_default_backend,
                              H200_FAILED_PROBES)
OFFLINE_CARDS = (H200_TORCH_2_11,)


def offline_card_for(identity: DeviceIdentity) -> OfflineCard | None:
    """The recorded card answers for a calibration's identity, or None (then `sdpa_default`'s
    features off the card are not the card's: fit and score on the card)."""
    return next((card for card in OFFLINE_CARDS if card.matches(identity)), None)


def card_line(card: OfflineCard | None) -> str:
    """One line saying whose backend choices and probes a refit or score uses."""
    if torch.cuda.is_available():
        return "PyTorch's backend choices and probes: asked of this machine's GPU"
    if card is None:
        return ("PyTorch's backend choices and probes: none recorded for this card, assumed (sdpa_default is "
                "ranked with other features than on the card)")
    return f"PyTorch's backend choices and probes: the {card.name} as recorded (bench.offline_card)"
