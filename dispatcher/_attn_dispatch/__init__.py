"""attn_dispatch: an adaptive attention dispatcher with a learned cost model.

This file is installed as ``attn_dispatch/__init__.py`` (see ``[tool.setuptools] package-dir`` in
``pyproject.toml``): the repository keeps ``dispatcher/``, ``kernels/``, ``models/`` and
``calibration/`` as top-level folders, installed as ``attn_dispatch.dispatcher``,
``attn_dispatch.kernels``, ``attn_dispatch.models`` and ``attn_dispatch.calibration``, so nothing
else on ``sys.path`` (a user's own ``models/``, Hugging Face's ``kernels``) can shadow them.

    import attn_dispatch as ad
    out = ad.attention(q, k, v, is_causal=True)   # drop-in for F.scaled_dot_product_attention
    with ad.patched():                            # every SDPA call in a model goes through it
        model.generate(...)
    ad.register_transformers()                    # then attn_implementation="attn_dispatch"
"""

from importlib import import_module as _import_module
from importlib import metadata as _metadata

from attn_dispatch.dispatcher import _PUBLIC, __all__


def __getattr__(name: str):
    """The public API of `attn_dispatch.dispatcher`, imported on first use (PEP 562: the command
    line's ``--help`` and ``--version`` never import torch)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attn_dispatch' has no attribute {name!r}")
    value = getattr(_import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


try:
    __version__ = _metadata.version("attn-dispatch")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"
