"""`measure_peak_bytes` keeps Python's cycle collector out of the measured call (on CUDA a
collection freeing older garbage mid-call hid the call's own allocations)."""

from __future__ import annotations

import gc

import pytest

from attn_dispatch.models.gc_pause import cyclic_collection_paused as _no_garbage_collection


@pytest.mark.parametrize("enabled_before", [True, False])
def test_collector_is_off_inside_and_restored_after(enabled_before):
    (gc.enable if enabled_before else gc.disable)()
    try:
        with _no_garbage_collection():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled_before
        with pytest.raises(RuntimeError), _no_garbage_collection():
            raise RuntimeError("a kernel failed")
        assert gc.isenabled() == enabled_before
    finally:
        gc.enable()
