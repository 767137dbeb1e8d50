"""No testbed state (SSH keys, API keys, tokens) is ever committed."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (ROOT / ".git").exists() or not shutil.which("git"), reason="not a git checkout")
def test_no_testbed_state_or_private_keys_tracked():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert not [f for f in files if f.startswith(".testbed")]
    for f in files:
        p = ROOT / f
        if p.is_file() and p.stat().st_size < 100_000:
            assert b"PRIVATE" + b" KEY-----" not in p.read_bytes(), f
