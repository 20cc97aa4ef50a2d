"""kernels: what runs. Attention implementations with exact `F.scaled_dot_product_attention`
semantics, each declaring what it supports (`reasons`) and its extra memory (`workspace_bytes`).

No dependency on the other packages of attn-dispatch.
"""

from attn_dispatch.kernels.accuracy import LOSSLESS, AccuracyPolicy
from attn_dispatch.kernels.base import Kernel, UnsupportedProblemError
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.reference import reference_attention, relative_errors
from attn_dispatch.kernels.registry import (
    FAMILIES,
    all_kernels,
    kernel_from_name,
    param_space,
    portable_kernels,
)
from attn_dispatch.kernels.sdpa_backends import (
    SdpaCudnnKernel,
    SdpaEfficientKernel,
    SdpaFlashKernel,
    SdpaMathKernel,
)
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel
from attn_dispatch.kernels.sdpa_gqa_fold import SdpaGqaFoldKernel
from attn_dispatch.kernels.small_q import SmallQKernel
from attn_dispatch.kernels.tolerances import TOLERANCES, Tolerance
from attn_dispatch.kernels.triton_flash import TritonFlashKernel
from attn_dispatch.kernels.triton_decode import TritonDecodeKernel

__all__ = [
    "LOSSLESS", "AccuracyPolicy", "Kernel", "UnsupportedProblemError", "ChunkedKernel",
    "ConvertKernel", "MathKernel", "Problem", "reference_attention", "relative_errors", "FAMILIES",
    "all_kernels", "kernel_from_name", "param_space", "portable_kernels", "SdpaCudnnKernel",
    "SdpaDefaultKernel", "SdpaEfficientKernel", "SdpaFlashKernel", "SdpaGqaFoldKernel", "SdpaMathKernel",
    "SmallQKernel", "TOLERANCES", "Tolerance", "TritonDecodeKernel", "TritonFlashKernel",
]
