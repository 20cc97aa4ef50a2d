"""The README's Python snippet (the first ```python block) runs as written: a new user's first try."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readmes_python_snippet_runs(tmp_path):
    snippet = re.search(r"^```python\n(.*?)^```$", README.read_text(), re.M | re.S)
    assert snippet is not None, "README.md has no ```python block"
    script = tmp_path / "snippet.py"
    script.write_text(snippet.group(1))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={"ATTN_DISPATCH_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin",
                               "OMP_NUM_THREADS": "1",
                               "ATTN_DISPATCH_AUTO_BUILD": "0"}, cwd=tmp_path)  # the suite spawns no compile
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sdpa_default" in done.stdout  # `explain` printed its ranking
