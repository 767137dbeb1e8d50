"""Fleet layer: batches refuse nonsense, the lock script works under bash (atomic, holder-only
release, expiry), the gate never restarts, and no import cycle between cli and the fleet code."""
import ast
import subprocess
from pathlib import Path

import pytest

from nemofleet import rollout

ROOT = Path(__file__).resolve().parents[2]


def test_batches_canary_first_then_percentages():
    assert rollout.batches(list("abcde"), "50%", 1) == [["a"], ["b", "c", "d"], ["e"]]
    assert rollout.batches(list("abc"), "1", 0) == [["a"], ["b"], ["c"]]


@pytest.mark.parametrize("batch, canary, words", [
    ("0%", 0, "percentage from 1% to 100%"), ("0", 0, "at least 1"), ("lots", 0, "a count (N)"),
    ("150%", 0, "1% to 100%"), ("1", -1, "--canary -1"), ("1", 3, "fewer than the 3"),
])
def test_bad_batch_or_canary_refused(batch, canary, words):
    with pytest.raises(ValueError, match=None) as exc:
        rollout.batches(list("abc"), batch, canary)
    assert words in str(exc.value)


def run(script, tmp_path):
    script = script.replace("/var/lib/nemofleet", str(tmp_path))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout


def test_lock_is_atomic_holder_released_and_expires(tmp_path):
    assert "LOCKED" in run(rollout.lock_script("acquire", "m", "tok1"), tmp_path)
    second = run(rollout.lock_script("acquire", "m", "tok2"), tmp_path)
    assert "HELD" in second and '"token": "tok1"' in second
    assert "NOT-HOLDER" in run(rollout.lock_script("release", token="tok2"), tmp_path)
    assert (tmp_path / "lock").is_dir()
    assert "RELEASED" in run(rollout.lock_script("release", token="tok1"), tmp_path)
    assert not (tmp_path / "lock").exists()
    # an expired lock (a crashed rollout) is taken over, and says so
    run(rollout.lock_script("acquire", "old", "tok3", ttl=-10), tmp_path)
    taken = run(rollout.lock_script("acquire", "new", "tok4"), tmp_path)
    assert "EXPIRED" in taken and "LOCKED" in taken
    assert "RELEASED" in run(rollout.lock_script("release", force=True), tmp_path)


def test_no_import_cycle_between_cli_and_fleet():
    tree = ast.parse((ROOT / "src/nemofleet/rollout.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "cli" not in imported and not any((m or "").endswith(".cli") for m in imported)


def test_pyinfra_runs_as_this_interpreters_module(monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        raise subprocess.TimeoutExpired(cmd, 1, output=b"partial out", stderr=b"err")
    monkeypatch.setattr(subprocess, "run", fake_run)
    r = rollout.pyinfra("inv.py", ["h"], "exec", "--", "true", timeout=1)
    import sys
    assert seen["cmd"][:3] == [sys.executable, "-m", "pyinfra"]
    assert r.returncode == 124 and "partial out" in r.stdout and "timed out after 1s" in r.stderr
