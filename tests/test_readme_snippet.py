"""The README's Python snippet (the first ```python block) runs as written, from the clone root,
where a new user starts (so the root's folders must hide no installed package: transformers
imports Hugging Face's `kernels`), with its `register_transformers()` line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_readmes_python_snippet_runs_from_the_clone_root(tmp_path):
    snippet = re.search(r"^```python\n(.*?)^```$", README.read_text(), re.M | re.S)
    assert snippet is not None, "README.md has no ```python block"
    assert "ad.register_transformers()" in snippet.group(1)
    done = subprocess.run([sys.executable, "-c", snippet.group(1)], capture_output=True, text=True, timeout=600,
                          env={"ATTN_DISPATCH_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin",
                               "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sdpa_default" in done.stdout  # `explain` printed its ranking
