"""A regular (non-editable) install lives under one import name, `attn_dispatch`, and works from a
directory that holds its own `models/` and `kernels/` packages (as many ML repositories do, and as
Hugging Face's `kernels` package installs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "dispatcher", "kernels", "models", "calibration")

USER_PACKAGES = {
    # a user's own packages with the names our folders have in the repository
    "models/__init__.py": "raise ImportError('the user models package was imported by attn_dispatch')\n",
    "models/features.py": "FEATURE_NAMES = 'not ours'\n",
    "kernels/__init__.py": "raise ImportError('the user kernels package was imported by attn_dispatch')\n",
    "dispatcher/__init__.py": "raise ImportError('the user dispatcher package was imported by attn_dispatch')\n",
    "calibration/__init__.py": "raise ImportError('the user calibration package was imported by attn_dispatch')\n",
}

PROBE = textwrap.dedent(
    """
    import json, sys
    import torch, torch.nn.functional as F
    import attn_dispatch as ad
    from attn_dispatch.models.features import FEATURE_NAMES
    from attn_dispatch.kernels import kernel_from_name
    import attn_dispatch.calibration.plan, attn_dispatch.dispatcher.cli

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 33, 16) for _ in range(3))
    out = ad.attention(q, k, v, is_causal=True)
    with ad.patched():
        patched = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(json.dumps({
        "file": ad.__file__, "version": ad.__version__,
        "error": float((out - expected).abs().max()), "patched_error": float((patched - expected).abs().max()),
        "features": len(FEATURE_NAMES), "policy": ad.AccuracyPolicy.__name__,
        "math": kernel_from_name("math").name,
        "stats": ad.stats(),
    }))
    """
)


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow
def test_wheel_installs_under_one_namespace_beside_a_users_own_packages(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "--quiet",
          "--wheel-dir", str(wheels), str(source)])
    (wheel,) = wheels.glob("attn_dispatch-*.whl")
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--quiet", "--target", str(site), str(wheel)])

    top_level = sorted(path.name for path in site.iterdir() if not path.name.endswith(".dist-info"))
    assert top_level == ["attn_dispatch", "bin"] or top_level == ["attn_dispatch"], top_level
    assert (site / "attn_dispatch" / "models" / "tables" / "nvidia-h200-140gb.json").is_file()
    assert (site / "attn_dispatch" / "dispatcher" / "fast_call.cpp").is_file()  # `attn-dispatch build-fast-path`

    user = tmp_path / "user_project"
    for relative, text in USER_PACKAGES.items():
        (user / relative).parent.mkdir(parents=True, exist_ok=True)
        (user / relative).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(site), "ATTN_DISPATCH_HOME": str(tmp_path / "home")}
    done = _run([sys.executable, "-c", PROBE], cwd=user, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).is_relative_to(site), result["file"]  # the wheel, not the repository
    assert result["error"] < 1e-5 and result["patched_error"] < 1e-5
    assert result["policy"] == "AccuracyPolicy" and result["math"] == "math" and result["features"] > 5
    assert sum(result["stats"].values()) == 2

    cli = _run([sys.executable, "-m", "attn_dispatch", "--version"], cwd=user, env=env)
    assert cli.stdout.strip() == f"attn-dispatch {result['version']}"
