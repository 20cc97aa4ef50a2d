"""kernels: what runs. Attention implementations with exact `F.scaled_dot_product_attention`
semantics, each declaring what it supports (`reasons`) and its extra memory (`workspace_bytes`).

No dependency on the other packages of attn-dispatch.
"""

from kernels.accuracy import LOSSLESS, AccuracyPolicy
from kernels.base import Kernel, UnsupportedProblemError
from kernels.chunked import ChunkedKernel
from kernels.convert import ConvertKernel
from kernels.math_kernel import MathKernel
from kernels.problem import Problem
from kernels.reference import reference_attention, relative_errors
from kernels.registry import (
    FAMILIES,
    all_kernels,
    kernel_from_name,
    param_space,
    portable_kernels,
)
from kernels.sdpa_backends import (
    SdpaCudnnKernel,
    SdpaDefaultKernel,
    SdpaEfficientKernel,
    SdpaFlashKernel,
    SdpaMathKernel,
)
from kernels.small_q import SmallQKernel
from kernels.tolerances import TOLERANCES, Tolerance

__all__ = [
    "LOSSLESS", "AccuracyPolicy", "Kernel", "UnsupportedProblemError", "ChunkedKernel",
    "ConvertKernel", "MathKernel", "Problem", "reference_attention", "relative_errors", "FAMILIES",
    "all_kernels", "kernel_from_name", "param_space", "portable_kernels", "SdpaCudnnKernel",
    "SdpaDefaultKernel", "SdpaEfficientKernel", "SdpaFlashKernel", "SdpaMathKernel",
    "SmallQKernel", "TOLERANCES", "Tolerance",
]
