"""The README's Python snippets run as written, from the clone root, where a new user starts (so the
root's folders must hide no installed package: transformers imports Hugging Face's `kernels`): the
first with only the quick start's install, the second with transformers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_readmes_python_snippets_run_from_the_clone_root(tmp_path):
    """The first block needs nothing beyond the quick start's install; the second (transformers) runs after it."""
    snippets = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.M | re.S)
    assert len(snippets) >= 2, "README.md lacks its two ```python blocks"
    first, with_transformers = snippets[0], snippets[1]
    assert "transformers" not in first  # the quick start does not install it
    assert "ad.register_transformers()" in with_transformers
    done = subprocess.run([sys.executable, "-c", first + with_transformers], capture_output=True, text=True,
                          timeout=600, env={"ATTN_DISPATCH_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin",
                                            "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sdpa_default" in done.stdout  # `explain` printed its ranking
