"""Inventory files check themselves under the pyinfra command: no hosts, or a --limit typo, is
one sentence and a non-zero exit (pyinfra alone warns and exits 0 having done nothing)."""
import os
import subprocess
import sys
from pathlib import Path

from nemofleet import inventory

NS = {"__file__": "inventories/prod.py", "gpu_h100": [("h100-01", {"ssh_user": "root"}), "h100-02"],
      "gpu_h200": [], "_private": ["x"], "os": os}


def test_a_limit_matching_nothing_is_refused():
    assert inventory.problem(NS, ["pyinfra", "inv.py", "deploy.py", "--limit", "gpu_h10"], "inv.py") == (
        "--limit gpu_h10 matches no host or group of inv.py (groups: gpu_h100)")
    assert inventory.problem(NS, ["pyinfra", "inv.py", "d.py", "--limit=h100-0*"], "inv.py") is None
    assert inventory.problem(NS, ["pyinfra", "inv.py", "d.py", "--limit", "gpu_h100", "--limit", "nope"], "i") \
        .startswith("--limit nope matches no host")


def test_an_inventory_without_hosts_is_refused():
    assert inventory.problem({"gpu_h100": []}, ["pyinfra"], "inv.py") == "inv.py has no hosts: nothing would be deployed"


def test_only_the_pyinfra_command_is_checked():
    assert inventory._under_pyinfra(["/x/.venv/bin/pyinfra", "i.py"])
    assert inventory._under_pyinfra(["/x/site-packages/pyinfra/__main__.py", "i.py"])
    assert not inventory._under_pyinfra(["/x/bin/pytest", "--limit", "zzz"])


def test_real_pyinfra_exits_non_zero_on_a_limit_typo(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text('gpu_h100 = [("h1", {"ssh_hostname": "127.0.0.1", "ssh_port": 1})]\n'
                   "from nemofleet.inventory import checked\nchecked(globals())\n")
    (tmp_path / "d.py").write_text("")
    pyinfra = Path(sys.executable).with_name("pyinfra")
    r = subprocess.run([str(pyinfra), "-y", str(inv), str(tmp_path / "d.py"), "--limit", "gpu_h10"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "--limit gpu_h10 matches no host or group" in r.stdout + r.stderr, r.stdout + r.stderr
