"""The transformers attention function without transformers: which dispatcher it calls, bound
once when the function is made; and what `register_transformers()` says when transformers is
missing, too old or fails to import."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import Dispatcher, api
from attn_dispatch.dispatcher.hf import make_attention_function, register_transformers
from tests.dispatcher.helpers import assert_matches_reference, qkv


def test_default_dispatcher_is_looked_up_once(monkeypatch):
    lookups = {"n": 0}
    default = api.default_dispatcher

    def counting_default():
        lookups["n"] += 1
        return default()

    monkeypatch.setattr(api, "default_dispatcher", counting_default)
    forward = make_attention_function()
    inputs = qkv()
    for _ in range(3):
        out, weights = forward(torch.nn.Module(), inputs["query"], inputs["key"], inputs["value"], None, is_causal=False)
        assert weights is None
    assert_matches_reference(out.transpose(1, 2), inputs)
    assert lookups["n"] == 1
    assert sum(dispatcher.stats().values()) == 3


def test_own_dispatcher_is_called():
    ours = Dispatcher(kernels=["math"])
    inputs = qkv()
    make_attention_function(ours)(torch.nn.Module(), inputs["query"], inputs["key"], inputs["value"], None, is_causal=False)
    assert ours.stats() == {"math": 1} and dispatcher.stats() == {}


def test_a_failing_transformers_import_is_shown_as_it_is(tmp_path, monkeypatch):
    # transformers installed but broken inside (e.g. the `kernels` it imports is not Hugging Face's)
    broken = tmp_path / "transformers"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError(\"cannot import name 'CUDAProperties' from 'kernels'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    with pytest.raises(ImportError, match="^cannot import name 'CUDAProperties' from 'kernels'$"):
        register_transformers()


def test_no_transformers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what Python does for a package that is absent
    with pytest.raises(ModuleNotFoundError, match=r"needs transformers >= 4\.48: pip install -U transformers"):
        register_transformers()


def test_an_old_transformers_is_named(monkeypatch):
    old = types.ModuleType("transformers")
    old.__version__ = "4.40.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    with pytest.raises(ImportError, match=r"transformers 4\.40\.0 is installed"):
        register_transformers()
