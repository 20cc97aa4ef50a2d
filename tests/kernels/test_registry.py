"""Names round-trip; default variants; policy; probes."""

from __future__ import annotations

import pytest

from attn_dispatch.kernels import (
    FAMILIES,
    AccuracyPolicy,
    Problem,
    all_kernels,
    kernel_from_name,
    param_space,
    portable_kernels,
)
from attn_dispatch.kernels.registry import tuned_siblings
from attn_dispatch.kernels.sdpa_backends import SdpaEfficientKernel, SdpaFlashKernel
from attn_dispatch.kernels.sdpa_default import clear_probe_cache, probe_backend


@pytest.mark.parametrize("kernel", all_kernels(), ids=lambda k: k.name)
def test_names_round_trip(kernel):
    rebuilt = kernel_from_name(kernel.name)
    assert rebuilt == kernel and rebuilt.name == kernel.name and type(rebuilt) is type(kernel)


def test_every_family_has_a_default_variant():
    families = {kernel.family for kernel in all_kernels()}
    assert families == set(FAMILIES)


def test_portable_kernels_have_no_fused_backend():
    names = [kernel.name for kernel in portable_kernels()]
    assert names and not any("sdpa_" in name for name in names)
    assert {"math", "chunked", "small_q", "convert"} <= {kernel_from_name(n).family for n in names}


def test_param_spaces():
    assert set(param_space("chunked")) == {"q", "kv"}
    assert set(param_space("small_q")) == {"splits"}
    assert param_space("math") == {}
    with pytest.raises(ValueError, match="unknown kernel family"):
        param_space("nope")


def test_lossy_conversion_needs_a_policy():
    problem = Problem(1, 2, 2, 4, 4, 64, 64, "float32")
    strict = kernel_from_name("convert[fp32->fp16]+chunked[q=512,kv=4096]")
    assert any("lossy" in reason for reason in strict.reasons(problem))
    lenient = kernel_from_name("convert[fp32->fp16]+chunked[q=512,kv=4096]", policy=AccuracyPolicy.allowing("fp32->fp16"))
    assert lenient.reasons(problem) == []
    lossless = kernel_from_name("convert[bf16->fp32]+chunked[q=512,kv=4096]")
    assert lossless.reasons(problem.with_dtype("bfloat16")) == []


def test_cuda_backends_explain_themselves_on_cpu():
    problem = Problem(1, 2, 2, 4, 4, 64, 64, "float16")
    assert "no efficient attention backend for cpu" in SdpaEfficientKernel().reasons(problem)[0]


def test_probe_is_cached_and_reports_failures():
    clear_probe_cache()
    flash = SdpaFlashKernel()
    assert probe_backend(flash, "cpu", "float32", "base") is None
    assert probe_backend(flash, "cpu", "float32", "base") is None

    class Broken(SdpaFlashKernel):
        family = "sdpa_broken"

        def _call_op(self, query, key, value, bias, causal, scale):
            return super()._call_op(query, key, value, bias, causal, scale) * 1.1

    reason = probe_backend(Broken(), "cpu", "float32", "base")
    assert reason and "wrong results" in reason
    clear_probe_cache()


def test_tuned_siblings_are_configurations_of_families_in_the_set():
    kernels = [kernel_from_name("small_q[splits=8]"), kernel_from_name("sdpa_flash")]
    names = ["small_q[splits=64]", "small_q[splits=8]", "chunked[q=64,kv=512]",
             "convert[bf16->fp16]+small_q[splits=64]", "not_a_kernel[x=1]", "small_q[splits=64]"]
    assert [kernel.name for kernel in tuned_siblings(names, kernels)] == ["small_q[splits=64]"]
