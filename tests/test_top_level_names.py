"""The clone root's folders never hide an installed package of the same name.

Python puts the current directory first on sys.path (`python -c`, the REPL, `python -m pytest`,
`python -m bench.X`), so from the clone root `import kernels` meets our `kernels/` folder before
Hugging Face's `kernels` package, which transformers >= 5 imports. Our folder steps aside there
(`kernels/__init__.py`): these tests start Python from the clone root with a stand-in distribution
named `kernels` installed in a throwaway directory, and check that it wins.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLONE_ROOT = Path(__file__).resolve().parents[1]
STAND_IN_VERSION = "0.0.1"


def _install_stand_in(target: Path) -> Path:
    """Write a distribution named `kernels` (a package with a submodule, and its metadata) into `target`."""
    package = target / "kernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("WHO = 'stand-in'\n")
    (package / "layer.py").write_text("from kernels import WHO\nLAYER = WHO + ' layer'\n")
    metadata = target / f"kernels-{STAND_IN_VERSION}.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kernels\nVersion: {STAND_IN_VERSION}\n")
    return target


def _python_from_the_clone_root(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, *args], cwd=CLONE_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_an_installed_kernels_package_wins_over_our_folder(tmp_path):
    site = _install_stand_in(tmp_path / "site")
    done = _python_from_the_clone_root(
        "-c",
        "import importlib.metadata, kernels, kernels.layer\n"
        "print(kernels.WHO, '|', kernels.layer.LAYER, '|', kernels.__file__, '|', importlib.metadata.version('kernels'))",
        pythonpath=site,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    who, layer, origin, version = (part.strip() for part in done.stdout.split("|"))
    assert (who, layer, version) == ("stand-in", "stand-in layer", STAND_IN_VERSION)
    assert Path(origin).resolve() == site / "kernels" / "__init__.py"


def test_without_an_installed_kernels_package_the_import_gives_an_empty_namespace():
    # -S: no site-packages, so no Hugging Face `kernels` either; the clone root stays first on sys.path.
    # An empty namespace (no __file__, no __version__) is what transformers' availability check reads
    # as "a folder shadowing, not an installed package": `import transformers` goes on without it.
    done = _python_from_the_clone_root(
        "-S", "-c",
        "import kernels\n"
        "print(kernels.__file__, hasattr(kernels, '__version__'), list(kernels.__path__))\n"
        "try:\n    from kernels import Problem\nexcept ImportError:\n    print('ImportError')",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "False", "[]", "ImportError"]


def test_our_package_is_still_ours_under_its_own_name(tmp_path):
    done = _python_from_the_clone_root(
        "-c", "import attn_dispatch.kernels as ours; print(ours.Problem.__module__)", pythonpath=_install_stand_in(tmp_path / "site")
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "attn_dispatch.kernels.problem"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_imports_from_the_clone_root():
    done = _python_from_the_clone_root("-c", "import transformers; transformers.LlamaConfig(); print('ok')")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
