"""What an inference process imports: `import attn_dispatch`, a `Dispatcher`, its first call and a
bundled table's ranking need torch and numpy only; scikit-learn and scipy (fitting, scoring),
joblib and optuna are calibration's. With torch._dynamo they cost a plain script 3.8-4.3 s before
its first call when imported eagerly (2-core CPU, torch 2.13). torch._dynamo (1.4-1.5 s here) is not
imported either: `dispatcher.compiled` marks its graph node when something else imports Dynamo
(`compiled.when_imported`; tests/test_first_call.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn_dispatch.kernels._layout import broadcast_sizes

HEAVY = ("sklearn", "scipy", "joblib", "optuna")
TABLE = Path(__file__).resolve().parents[1] / "models" / "tables" / "nvidia-h200-140gb.json"

SCRIPT = """
import json, sys
import torch
import attn_dispatch as ad
from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.models.table_io import load_table

ours = ad.Dispatcher()
q = torch.randn(1, 2, 4, 8)
ours.attention(q, q, q, is_causal=True)
ranked = load_table(sys.argv[1]).rank(Problem(1, 32, 8, 1, 4096, 128, 128, "bfloat16", device_type="cuda"),
                                      [kernel_from_name(n) for n in ("sdpa_flash", "sdpa_default", "math")])
print(json.dumps({"imported": [m for m in sys.argv[2:] if m in sys.modules], "ranked": sorted(n for n, _ in ranked)}))
"""


def test_inference_imports_no_fitting_or_tuning_library(tmp_path):
    env = {**os.environ, "ATTN_DISPATCH_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(TABLE), *HEAVY], capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["imported"] == []
    assert "sdpa_default" in result["ranked"] and len(result["ranked"]) >= 2  # the table predicted, numpy alone


@pytest.mark.parametrize("shapes", [
    [(2, 1, 3), (1, 4, 3)], [(5,), (2, 1, 5)], [(0, 1), (1, 3)], [(1, 0), (4, 1)], [()], [(), (2, 3)],
    [(3, 1), (1,), (2, 1, 1)], [(2, 3), (3, 3)], [(0,), (2,)], [(4,), (1, 4), (7, 1, 4)],
])
def test_broadcast_sizes_agrees_with_torch(shapes):
    try:
        expected = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        with pytest.raises(RuntimeError):
            broadcast_sizes(*shapes)
        return
    assert broadcast_sizes(*shapes) == expected
