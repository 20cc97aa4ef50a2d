"""The fast path (`fast_path`, `fast_call.cpp`): a hot plan that is PyTorch's own SDPA call is served
in C++ with PyTorch's exact result and no Python frame; everything else, and every call the Python
path would treat differently, goes to `Dispatcher.attention` with today's behaviour."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from attn_dispatch.dispatcher import Dispatcher, fast_path, patched
from attn_dispatch.dispatcher.fast_path_build import manifest_path
from attn_dispatch.models.environment import FAST_PATH
from tests.dispatcher.helpers import qkv

SDPA = torch._C._nn.scaled_dot_product_attention  # PyTorch's, never patched
WARM_CALLS = 2  # a plan's first call makes it, its second makes it hot (`hot_path.HOT_AFTER`)
TRUNCATED_BYTES = 20_000  # what a killed link or a full disk leaves: the new-user trial's SIGBUS reproducer
CHILD_TIMEOUT_S = 300  # a child that imports torch and makes one Dispatcher: seconds alone, far more when busy
FIX = "run `attn-dispatch build-fast-path`"


@pytest.fixture(autouse=True)
def built(fast_path_build):
    if isinstance(fast_path_build, RuntimeError):
        if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
            pytest.skip(f"no C++ compiler found: the fast path cannot be built ({fast_path_build})")
        raise fast_path_build
    if not fast_path.fast_path_enabled():
        pytest.skip("this torch has no torch.compiler.substitute_in_graph: no fast path")


def warm(ours: Dispatcher, *args, **kwargs):
    """The fast callable, with the plan of this call hot (its C++ entry made)."""
    fast = ours.fast_attention
    assert fast is not ours.attention, "the fast path did not load"
    for _ in range(WARM_CALLS):
        fast(*args, **kwargs)
    return fast


def served(ours: Dispatcher, call) -> bool:
    """Whether `call()` was served in C++ (the hit counter moved, no `attention` frame ran)."""
    frames: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            frames.append(frame.f_code.co_name)

    before = ours._fast.hits
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    hit = ours._fast.hits == before + 1
    assert hit is ("attention" not in frames), (hit, frames)
    return hit


def test_a_hot_call_is_served_in_cpp_with_pytorchs_exact_result():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(q_len=1, kv_len=33)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v, enable_gqa=True)
    out = []
    for _ in range(3):
        assert served(ours, lambda: out.append(fast(q, k, v, enable_gqa=True)))
    assert torch.equal(out[-1], SDPA(q, k, v, enable_gqa=True))
    assert ours.stats() == {"sdpa_default": WARM_CALLS + 3}  # counted as the Python hot path counts


def test_positional_and_keyword_forms_hit_the_same_entry():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4, q_len=5, kv_len=9)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v, is_causal=True)
    expected = SDPA(q, k, v, is_causal=True)
    for call in (lambda: fast(q, k, v, None, 0.0, True), lambda: fast(query=q, key=k, value=v, is_causal=True),
                 lambda: fast(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, enable_gqa=False)):
        result: list[torch.Tensor] = []
        assert served(ours, lambda call=call, result=result: result.append(call()))
        assert torch.equal(result[0], expected)
    assert not served(ours, lambda: fast(q, k, v))  # is_causal differs: another plan


def test_a_masked_call_with_scale_is_served():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4, q_len=4, kv_len=6)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    mask = torch.rand(1, 1, 4, 6) > 0.3
    fast = warm(ours, q, k, v, mask, scale=0.5)
    result = []
    assert served(ours, lambda: result.append(fast(q, k, v, mask, scale=0.5)))
    assert torch.equal(result[0], SDPA(q, k, v, mask, scale=0.5))


def test_a_scale_that_is_no_float_is_forwarded_to_pytorchs_sdpa_as_given():
    """ATen's SDPA is called directly only with a float scale or none; an int (PyTorch's parser takes
    it) is handed to PyTorch's SDPA unchanged, still served in C++."""
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4, q_len=3, kv_len=5)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v, scale=2)
    result = []
    assert served(ours, lambda: result.append(fast(q, k, v, scale=2)))
    assert torch.equal(result[0], SDPA(q, k, v, scale=2))
    assert served(ours, lambda: result.append(fast(q, k, v, scale=2.0)))  # the same entry, the ATen call
    assert torch.equal(result[1], SDPA(q, k, v, scale=2.0))


def test_served_calls_leave_the_callers_tensors_as_they_were():
    """The C++ path holds the caller's tensors while ATen runs without the GIL (`fast_call.cpp`'s
    `Held`): afterwards every reference it took is gone, and the output is a new tensor."""
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4, q_len=4, kv_len=6)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    mask = torch.rand(1, 1, 4, 6) > 0.3
    fast = warm(ours, q, k, v, mask)
    before = [sys.getrefcount(t) for t in (q, k, v, mask)]
    results = []
    for _ in range(5):
        assert served(ours, lambda: results.append(fast(q, k, v, mask)))
    assert [sys.getrefcount(t) for t in (q, k, v, mask)] == before
    assert len({out.data_ptr() for out in results}) == len(results)


class Sub(torch.Tensor):
    pass


class PassThrough(TorchFunctionMode):
    """A torch-function mode that runs every function as called."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


MISSES = {  # what differs from the entry of ``fast(q, k, v)``: a call that must go to Python
    "another shape": lambda f, q, k, v: f(q[:, :, :3], k, v),
    "strides (a slice)": lambda f, q, k, v: f(torch.randn(1, 4, 8, 32)[..., :16], k, v),
    "dtype": lambda f, q, k, v: f(q.double(), k.double(), v.double()),
    "dropout": lambda f, q, k, v: f(q, k, v, dropout_p=0.5),
    "an int dropout": lambda f, q, k, v: f(q, k, v, None, 0),
    "a subclass": lambda f, q, k, v: f(q.as_subclass(Sub), k, v),
    "a subclass key": lambda f, q, k, v: f(q, k.as_subclass(Sub), v),
    "inference mode": lambda f, q, k, v: _in(torch.inference_mode(), f, q, k, v),
    "autocast": lambda f, q, k, v: _in(torch.autocast("cpu", dtype=torch.bfloat16), f, q, k, v),
    "a torch-function mode": lambda f, q, k, v: _in(PassThrough(), f, q, k, v),
}


def _in(context, fast, *args):
    with context:
        return fast(*args)


@pytest.mark.parametrize("name", MISSES)
def test_calls_the_entry_does_not_cover_go_to_python_with_the_python_path_s_result(name):
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    ours, reference = Dispatcher(kernels=["sdpa_default"]), Dispatcher(kernels=["sdpa_default"])
    fast = warm(ours, q, k, v)
    results = []
    torch.manual_seed(0)  # dropout: the same draw in both
    assert not served(ours, lambda: results.append(MISSES[name](fast, q, k, v)))
    torch.manual_seed(0)
    assert torch.equal(results[0], MISSES[name](reference.attention, q, k, v))


def test_a_tensor_requiring_grad_under_grad_goes_to_python():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v)
    trained = q.clone().requires_grad_()
    results = []
    assert not served(ours, lambda: results.append(fast(trained, k, v)))
    results[0].sum().backward()
    assert trained.grad is not None


def test_nested_tensors_go_to_python_and_behave_as_pytorchs_sdpa():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v)
    nested = [torch.nested.nested_tensor([t[0], t[0]]) for t in (q, k, v)]
    try:
        expected = SDPA(*nested)
    except Exception as error:  # noqa: BLE001 - PyTorch refuses it on this build: so must we
        with pytest.raises(type(error)):
            fast(*nested)
    else:
        result = []
        assert not served(ours, lambda: result.append(fast(*nested)))
        assert torch.equal(result[0].to_padded_tensor(0.0), expected.to_padded_tensor(0.0))


def test_restricted_backends_raise_pytorchs_own_error():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # none on a CPU
        with pytest.raises(RuntimeError) as pytorchs:
            SDPA(q, k, v)
        with pytest.raises(RuntimeError) as ours_error:
            fast(q, k, v)
    assert str(ours_error.value) == str(pytorchs.value)


def test_a_served_call_that_raises_warns_as_pytorch_warns_once():
    """ATen warns, then raises (3-D inputs under a flash-only restriction): the call is made again
    by the Python path, so the C++ entry's own warnings are dropped, not raised twice (helper nu13's
    reproducer: 4 warnings against PyTorch's 2)."""
    ours = Dispatcher(kernels=["sdpa_default"])
    q = torch.randn(2, 3, 8)
    fast = warm(ours, q, q, q)
    assert served(ours, lambda: fast(q, q, q))

    def warnings_and_error(call):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError) as error:
                call()
        return [(w.category, str(w.message)) for w in caught], str(error.value)

    assert warnings_and_error(lambda: fast(q, q, q)) == warnings_and_error(lambda: SDPA(q, q, q))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning turned into an error: PyTorch's exception all the same
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError, match="No available kernel"):
            fast(q, q, q)


def test_bad_arguments_raise_sdpa_s_type_error():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v)
    for args, kwargs in (((1, 2, 3), {}), ((q, k, v), {"bogus": 1}), ((q, k), {}), ((q, k, v), {"scale": "x"}),
                         ((q, k, v, None, 0.0, False, 1.0), {}), ((q, k, v, None), {"attn_mask": None}),
                         ((q, k, v), {"is_causal": 0})):
        with pytest.raises(TypeError):
            SDPA(*args, **kwargs)
        with pytest.raises(TypeError):
            fast(*args, **kwargs)
    assert ours.stats() == {"sdpa_default": WARM_CALLS}  # the failed calls left the count alone


def test_the_settling_call_goes_to_python():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    ours.attention(q, k, v)
    (plan,) = ours._plans.table.values()
    plan.settle_at = WARM_CALLS + 2  # the entry (made on the next call) records it
    settling = []
    original = ours._cold.settle
    ours._cold.settle = lambda key_, plan_: settling.append(plan_) or original(key_, plan_)
    fast = ours.fast_attention
    fast(q, k, v)  # hot now
    assert served(ours, lambda: fast(q, k, v))  # call WARM_CALLS + 1
    assert not served(ours, lambda: fast(q, k, v)) and settling == [plan]  # the settle point: Python
    assert served(ours, lambda: fast(q, k, v))
    assert plan.count[0] == WARM_CALLS + 3


def test_a_plan_dropped_evicted_or_reset_on_the_python_side_is_no_longer_served():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v)
    assert served(ours, lambda: fast(q, k, v))
    (key_,) = ours._plans.table
    ours._hot_path.drop(key_)
    assert not served(ours, lambda: fast(q, k, v))  # the dict path's 2nd call in a row: hot again
    assert served(ours, lambda: fast(q, k, v))
    ours._plans.limit = 1
    fast(q[:, :, :3], k, v)  # another shape evicts the first plan
    assert not served(ours, lambda: fast(q, k, v))
    warm(ours, q, k, v)
    ours.reset()
    assert not served(ours, lambda: fast(q, k, v))


def test_a_failing_forwarded_call_goes_through_python_recovery(monkeypatch):
    """The C++ call of PyTorch's SDPA runs out of memory once: the call is handed to
    `Dispatcher.attention`, whose own hot path then fails too and recovers on the next kernel."""
    failures = []

    def out_of_memory_once(*args, **kwargs):
        if not failures:
            failures.append(args)
            raise torch.OutOfMemoryError("out of memory (injected)")
        return SDPA(*args, **kwargs)

    monkeypatch.setattr(fast_path, "pytorch_sdpa", out_of_memory_once)
    from attn_dispatch.dispatcher import core

    ours = Dispatcher(kernels=["sdpa_default", "math"])
    inputs = qkv(kv_heads=4)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    fast = warm(ours, q, k, v)
    assert ours._fast.hits == 0 and ours.stats() == {"sdpa_default": WARM_CALLS}
    python_failures = []

    def python_out_of_memory(*args, **kwargs):
        python_failures.append(args)
        raise torch.OutOfMemoryError("out of memory (injected)")

    monkeypatch.setattr(core, "_sdpa", python_out_of_memory)
    out = fast(q, k, v)
    assert len(failures) == 1 and len(python_failures) == 1
    torch.testing.assert_close(out, SDPA(q, k, v))
    assert ours.stats() == {"sdpa_default": WARM_CALLS, "math": 1}  # the failed try is not counted twice


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(FAST_PATH.name, "0")
    ours = Dispatcher(kernels=["sdpa_default"])
    assert ours.fast_attention == ours.attention


def test_a_library_without_a_manifest_is_not_built_and_never_loaded(monkeypatch, tmp_path):
    """A folder from before manifests, or a foreign file: treated as not built (never dlopened)."""
    monkeypatch.setattr(fast_path, "_loaded", {})
    library = fast_path.library_path(tmp_path)
    library.parent.mkdir(parents=True)
    library.write_bytes(b"not a shared library")
    assert fast_path.load(tmp_path) is None
    status = fast_path.status(tmp_path)
    assert status.startswith("not built") and status.endswith(f"{FIX} ({fast_path.WITHOUT_IT})") and "rejected" not in status
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert ours.fast_attention == ours.attention
    inputs = qkv(kv_heads=4)
    assert torch.equal(ours.fast_attention(inputs["query"], inputs["key"], inputs["value"]),
                       SDPA(inputs["query"], inputs["key"], inputs["value"]))


def installed_copy(home: Path, built: Path) -> Path:
    """The session's build (library and manifest) installed under `home`: its library's path."""
    library = fast_path.library_path(home)
    library.parent.mkdir(parents=True)
    shutil.copy(built, library)
    shutil.copy(manifest_path(built), manifest_path(library))
    return library


def test_a_built_library_loads_from_the_home_directory(monkeypatch, tmp_path, fast_path_build):
    library = installed_copy(tmp_path / "home", fast_path_build)
    monkeypatch.setattr(fast_path, "_loaded", {})
    module = fast_path.load(tmp_path / "home")
    assert module is not None and module.__file__ == str(library)
    before = served_in_cpp(fast_path.status(tmp_path / "home"), library)
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path / "home"))
    inputs = qkv(kv_heads=4)
    fast = warm(ours, inputs["query"], inputs["key"], inputs["value"])
    fast(inputs["query"], inputs["key"], inputs["value"])
    assert served_in_cpp(fast_path.status(tmp_path / "home"), library) == before + 1


def served_in_cpp(status: str, library: Path) -> int:
    """The count in `status`'s ``loaded <library> (N calls served in C++ by this process's dispatchers)``."""
    found = re.fullmatch(rf"loaded {re.escape(str(library))} \((\d+) calls served in C\+\+ by this process's "
                         r"dispatchers\)", status)
    assert found, status
    return int(found.group(1))


def truncate(library: Path, forge_manifest: bool) -> str:
    """Cut `library` to its first `TRUNCATED_BYTES`; with `forge_manifest`, the manifest's size is
    made to match (its sha256 still does not): the reason `status` must give."""
    library.write_bytes(library.read_bytes()[:TRUNCATED_BYTES])
    if not forge_manifest:
        return f"is {TRUNCATED_BYTES} bytes, its manifest says "
    manifest = json.loads(manifest_path(library).read_text())
    manifest["size"] = TRUNCATED_BYTES
    manifest_path(library).write_text(json.dumps(manifest))
    return "sha256 differs from its manifest's"


@pytest.mark.parametrize("forge_manifest", [False, True], ids=["manifest kept", "manifest forged"])
def test_a_truncated_library_says_why_and_is_never_loaded(monkeypatch, tmp_path, fast_path_build, forge_manifest):
    reason = truncate(installed_copy(tmp_path, fast_path_build), forge_manifest)
    monkeypatch.setattr(fast_path, "_loaded", {})
    assert fast_path.load(tmp_path) is None
    status = fast_path.status(tmp_path)
    assert status.startswith("built library rejected (") and reason in status and status.endswith(f"): {FIX} ({fast_path.WITHOUT_IT})")


CHILD = """
import attn_dispatch as ad
from attn_dispatch.dispatcher import fast_path
ours = ad.Dispatcher()
print(ours.fast_attention == ours.attention)
print(fast_path.status())
"""


@pytest.mark.parametrize("forge_manifest", [False, True], ids=["manifest kept", "manifest forged"])
def test_a_dispatcher_made_over_a_truncated_library_has_no_fast_path(tmp_path, fast_path_build, forge_manifest):
    """In a child process, so a crash (dlopening a partial file dies of SIGBUS) fails the test."""
    reason = truncate(installed_copy(tmp_path, fast_path_build), forge_manifest)
    environment = {**os.environ, "ATTN_DISPATCH_HOME": str(tmp_path)}
    environment.pop(FAST_PATH.name, None)
    child = subprocess.run([sys.executable, "-c", CHILD], env=environment, capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    python_path_serves, status = child.stdout.splitlines()
    assert python_path_serves == "True" and status.startswith("built library rejected (") and reason in status


ATTENTION_CHILD = """
import sys, torch
import attn_dispatch as ad
from attn_dispatch.dispatcher.api import default_dispatcher
q = torch.randn(1, 4, 1, 16)
k = torch.randn(1, 4, 40, 16)
outs = [ad.attention(q, k, k) for _ in range(5)]
ours = default_dispatcher()
print(ad.attention is ours.fast_attention, ours._fast.hits, "torch._dynamo" in sys.modules,
      torch.equal(outs[-1], torch.nn.functional.scaled_dot_product_attention(q, k, k)))
"""


def test_attention_is_the_fast_callable_and_imports_no_compiler(tmp_path, fast_path_build):
    """`attn_dispatch.attention`, the README's first drop-in, reaches the fast path as `patched()` does;
    handing it out imports no Dynamo (its compile stand-in waits for Dynamo's import)."""
    installed_copy(tmp_path, fast_path_build)
    environment = {**os.environ, "ATTN_DISPATCH_HOME": str(tmp_path), "ATTN_DISPATCH_MEASURE": "0"}
    environment.pop(FAST_PATH.name, None)
    child = subprocess.run([sys.executable, "-c", ATTENTION_CHILD], env=environment, capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S)
    assert child.returncode == 0, child.stderr[-2000:]
    is_fast, hits, dynamo, equal = child.stdout.split()
    assert (is_fast, dynamo, equal) == ("True", "False", "True") and int(hits) >= 1


def test_patching_and_stats_count_fast_calls():
    ours = Dispatcher(kernels=["sdpa_default"])
    inputs = qkv(kv_heads=4)
    with patched(ours):
        assert F.scaled_dot_product_attention is ours.fast_attention
        for _ in range(5):
            F.scaled_dot_product_attention(inputs["query"], inputs["key"], inputs["value"])
    assert ours._fast.hits == 5 - WARM_CALLS and ours.stats() == {"sdpa_default": 5}


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_model_patched_with_the_fast_path_compiles_whole_and_traces_the_chosen_kernel(monkeypatch):
    """Dynamo cannot trace into the builtin: its stand-in (`fast_path._register_stand_in`) calls
    `Dispatcher.attention`, whose compile branch traces the dispatcher's choice (chunked, not SDPA)."""
    from tests.dispatcher.helpers import FixedRanker, use_ranking
    from tests.dispatcher.test_compile import Attention, GraphCatcher

    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]"]))
    ours = Dispatcher(kernels=["chunked[q=128,kv=1024]", "math", "sdpa_default"])

    torch.manual_seed(0)
    module, x = Attention(), torch.randn(2, 24, 16)
    catcher = GraphCatcher()
    with torch.no_grad(), patched(ours):
        assert F.scaled_dot_product_attention is ours._fast.call  # the builtin, not the bound method
        eager = module(x)
        compiled = torch.compile(module, backend=catcher, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    targets = catcher.targets()
    assert not any("scaled_dot_product" in target for target in targets), targets
    assert ours.stats().get("chunked[q=128,kv=1024] (traced)") == 1


def test_a_mixed_call_sequence_counts_and_answers_as_the_python_path_does():
    """Shapes alternating past the two hot slots, masks, causal calls, inference mode: the fast
    callable gives PyTorch's exact results and the same `stats()` as a dispatcher called through
    `attention` only, while serving some of the calls in C++."""
    fast_side, python_side = Dispatcher(kernels=["sdpa_default"]), Dispatcher(kernels=["sdpa_default"])
    fast = fast_side.fast_attention
    shapes = [qkv(kv_heads=4, q_len=q_len, kv_len=kv_len, seed=q_len) for q_len, kv_len in ((1, 7), (3, 3), (2, 9))]
    mask = torch.rand(1, 1, 3, 3) > 0.5
    calls = []
    for round_ in range(6):
        for index, inputs in enumerate(shapes):
            q, k, v = inputs["query"], inputs["key"], inputs["value"]
            calls.append(((q, k, v), {}))
            if index == 1:
                calls.append(((q, k, v, mask), {}))
                calls.append(((q, k, v), {"is_causal": True, "scale": 0.25}))
            if round_ % 2:
                calls.append(((q, k, v), {}))  # the same shape twice in a row
    for inference in (False, True, False):
        with torch.inference_mode(inference):
            for args, kwargs in calls:
                assert torch.equal(fast(*args, **kwargs), SDPA(*args, **kwargs))
                python_side.attention(*args, **kwargs)
    assert fast_side.stats() == python_side.stats()
    assert fast_side._fast.hits > 0
