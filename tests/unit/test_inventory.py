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


HOSTS = 'gpu_a100 = [("a1", {"ssh_hostname": "127.0.0.1"}), "a2"]\n'
GROUPS = 'serving_groups = {"svl": ["a1", "a2"]}\n'
CHECKED = "from nemofleet.inventory import checked\nchecked(globals())\n"


def test_serving_groups_without_checked_are_refused_by_every_command_and_the_deploy(tmp_path, capsys):
    """An inventory that sets serving_groups but never calls checked(globals()) after it would plan
    each member alone: refused before any host is asked (every nemofleet command's inventory
    check, and the deploy's Run from pyinfra's own command line)."""
    from nemofleet import cli

    for name, text, refused in [("none.py", HOSTS + GROUPS, True), ("before.py", HOSTS + CHECKED + GROUPS, True),
                                ("ok.py", HOSTS + GROUPS + CHECKED, False), ("plain.py", HOSTS, False),
                                ("five.py", HOSTS + "serving_groups = 5\n" + CHECKED, False)]:
        (tmp_path / name).write_text(text)
        why = inventory.file_problem(str(tmp_path / name))
        assert (why is not None and "does not end with `checked(globals())`" in why) is refused, (name, why)
        assert (inventory.argv_problem(["pyinfra", "-y", str(tmp_path / name), "deploys/nemotron.py"]) == why)
    assert cli.main(["plan", str(tmp_path / "none.py")]) == 2
    assert "sets serving_groups but does not end with" in capsys.readouterr().err
    # checked() itself refuses a serving_groups that is no mapping (five.py loads no further)
    assert "serving_groups must be a mapping" in cli._inventory_problem(str(tmp_path / "five.py"))
