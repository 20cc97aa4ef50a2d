"""`launch_decode` registered as the operator ``torch.ops.attn_dispatch.triton_decode``
(`_triton_ops.triton_operator`): what `torch.compile` traces with no graph break. Imported only
where a call is traced (registering costs about a second)."""

from attn_dispatch.kernels._triton_decode_launch import launch_decode
from attn_dispatch.kernels._triton_ops import triton_operator

triton_decode_operator = triton_operator("attn_dispatch::triton_decode")(launch_decode)
