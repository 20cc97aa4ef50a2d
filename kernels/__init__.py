"""kernels: attention implementations with exact `F.scaled_dot_product_attention` semantics, each declaring what it
supports (`reasons`) and its extra memory (`workspace_bytes`). No dependency on the other packages."""

if __name__ == "kernels":
    # Imported as top-level `kernels` (from the clone root), this folder would hide Hugging Face's installed
    # `kernels` package (which transformers >= 5 imports): load that one in our place, else leave an empty
    # namespace package, which transformers' availability check tells from an installed one.
    def _load_the_installed_kernels() -> None:
        import importlib.machinery
        import importlib.util
        import os
        import sys
        import types

        clone_root = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))
        elsewhere = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != clone_root]
        spec = importlib.machinery.PathFinder.find_spec(__name__, elsewhere)
        if spec is None:
            empty = types.ModuleType(__name__)
            empty.__file__ = None
            empty.__path__ = []
            sys.modules[__name__] = empty
            return
        installed = importlib.util.module_from_spec(spec)
        sys.modules[__name__] = installed  # the import statement returns what sys.modules holds
        if spec.loader is not None:
            spec.loader.exec_module(installed)

    _load_the_installed_kernels()
else:
    from attn_dispatch.kernels.accuracy import LOSSLESS, TOLERANCES, AccuracyPolicy, Tolerance
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
    from attn_dispatch.kernels.triton_decode import TritonDecodeKernel
    from attn_dispatch.kernels.triton_flash import TritonFlashKernel

    __all__ = ["LOSSLESS", "AccuracyPolicy", "Kernel", "UnsupportedProblemError", "ChunkedKernel",
               "ConvertKernel", "MathKernel", "Problem", "reference_attention", "relative_errors", "FAMILIES",
               "all_kernels", "kernel_from_name", "param_space", "portable_kernels", "SdpaCudnnKernel",
               "SdpaDefaultKernel", "SdpaEfficientKernel", "SdpaFlashKernel", "SdpaGqaFoldKernel",
               "SdpaMathKernel", "SmallQKernel", "TOLERANCES", "Tolerance", "TritonDecodeKernel",
               "TritonFlashKernel"]
