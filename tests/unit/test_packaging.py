"""The nemofleet wheel is the product alone: no testbed (the simulated GPU tools, the stand-in vLLM,
the Hub mirror, the host profiles live in testbed/, the nemofleet-testbed package), dependencies that
are what its modules import, and a non-editable install (a wheel in a fresh venv, as on a controller
or a GPU host) plans and renders: the templates travel inside the wheel and are read with
importlib.resources."""
import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "testbed" / "src" / "nemofleet_testbed"
# the installed wheel alone: a caller's PYTHONPATH (a checkout's src) would make pip skip the install
# and the venv import the checkout
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
# the distribution of each top-level module the wheel's modules import (outside the standard library)
DISTRIBUTION = {"pyinfra": "pyinfra", "pyinfra_cli": "pyinfra", "jinja2": "jinja2", "pydantic": "pydantic"}
# the one import of the testbed: `nemofleet testbed` runs it where it is installed, else says what to install
HOOK = ("nemofleet_testbed", "nemofleet/cli.py")

SCRIPT = r"""
import importlib.util, nemofleet, pathlib
from nemofleet import render, settings
from nemofleet.plan import Gpu, make_plan
assert "site-packages" in nemofleet.__file__, nemofleet.__file__
assert importlib.util.find_spec("nemofleet_testbed") is None  # the testbed is not installed with the wheel
p = make_plan("h", [Gpu(0, "GPU-0", "NVIDIA H200", 143771, "9.0")], settings.defaults())
unit = render.unit(p, p.instances[0], [], 29)
assert "ExecStart=/usr/bin/docker run" in unit and settings.DEFAULT_IMAGE in unit
assert '"instances"' in render.health_config(p, settings.defaults()) and "def run_once" in render.health_program()
from nemofleet import remote  # the host programs travel in the wheel too
assert all("__main__" in remote.source(n) for n in ("weights_check", "models_on_disk", "hub", "engine_read", "health",
                                                  "lock", "release", "gpu_return", "host_status"))
print("rendered", len(unit))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built as `pip wheel` builds it, from a copy of the sources it is made of: setuptools
    packs whatever an earlier build left in the tree's build/lib (a checkout built before the testbed
    moved out still has build/lib/nemofleet/testbed there), so the tree itself is not built in place."""
    if not (ROOT / "pyproject.toml").exists():
        pytest.skip("needs the source tree")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src-tree"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("src", "templates"):  # src/nemofleet/templates is a relative link to templates/
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=junk)
    out = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, capture_output=True, cwd=tmp)
    (built,) = out.glob("nemofleet-*.whl")
    return built


def test_the_wheel_holds_no_testbed_file(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    # every file of the testbed package by name (the package's __init__.py and cli.py have product namesakes)
    simulated = {f.name for f in TESTBED.rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    simulated -= {"__init__.py", "cli.py"}
    assert {"nvidia-smi", "nvidia-ctk", "dmesg", "vllm_standin.py", "hfmirror.py", "default.yaml"} <= simulated
    # and by content, whatever the name
    contents = {f.read_bytes() for f in TESTBED.rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    z = zipfile.ZipFile(wheel)
    inside = sorted(n for n in names if "testbed" in n.lower() or PurePosixPath(n).name in simulated
                    or (not n.endswith("/") and z.read(n) in contents))
    assert inside == [], f"the nemofleet wheel holds testbed files: {inside}"
    assert any(n.startswith("nemofleet/templates/") for n in names) and "nemofleet/remote/health.py" in names


def test_the_wheels_dependencies_are_what_its_modules_import(wheel):
    z = zipfile.ZipFile(wheel)
    imported: dict[str, set[str]] = {}
    for name in z.namelist():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(z.read(name))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for m in mods:
                top = m.split(".")[0]
                if top != "nemofleet" and top not in sys.stdlib_module_names:
                    imported.setdefault(top, set()).add(name)
    assert imported.pop(HOOK[0], {HOOK[1]}) == {HOOK[1]}, "only the testbed hook of cli.py imports the testbed"
    unknown = sorted(set(imported) - set(DISTRIBUTION))
    assert unknown == [], f"modules import {unknown}: declare them in pyproject.toml and in DISTRIBUTION here"
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    required = {line.split(":", 1)[1].strip().split(";")[0] for line in meta.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    names = {r.replace(" ", "").split("~")[0].split(">")[0].split("<")[0].split("=")[0].lower() for r in required}
    assert names == {DISTRIBUTION[m] for m in imported}, f"declared {sorted(names)}, imported {sorted(imported)}"
    extras = {line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Provides-Extra:")}
    assert extras == {"dev"}  # no testbed extra: pyyaml is the testbed package's dependency


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the nemofleet wheel and its dependencies, nothing else (no testbed):
    a production controller."""
    venv = tmp_path_factory.mktemp("controller") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        str(wheel)], capture_output=True, text=True, cwd=venv, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    return venv


def test_wheel_in_a_fresh_venv_plans_and_renders(wheel_venv, tmp_path):
    from test_desired import REV, facts  # a host ready to serve, as the deploy's facts read it

    venv = wheel_venv
    py, nemofleet = venv / "bin" / "python", venv / "bin" / "nemofleet"
    r = subprocess.run([str(py), "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0 and "rendered" in r.stdout, r.stdout + r.stderr
    # the command line: a plan from a facts file, as before the hardware exists
    (tmp_path / "facts.json").write_text(json.dumps({"h200-1": facts()}))
    data = {"vllm_api_key": "sk-nf-" + "a" * 32, "model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}
    (tmp_path / "inv_wheel.py").write_text(f"hosts = {[('h200-1', data)]!r}\n")
    r = subprocess.run([str(nemofleet), "plan", "inv_wheel.py", "--facts", "facts.json", "-v"],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nemotron-0" in r.stdout and "--served-model-name nemotron-3.5-lightning" in r.stdout, r.stdout
    # without the testbed package, `nemofleet testbed` says what to install, in one sentence
    r = subprocess.run([str(nemofleet), "testbed", "up"], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert (r.returncode, r.stdout) == (2, "") and "Traceback" not in r.stderr
    assert r.stderr == ("nemofleet: `nemofleet testbed` needs the nemofleet-testbed package, which is not installed "
                        "here: in a nemofleet checkout run `make venv` (or `pip install -e ./testbed`)\n")


def test_the_main_job_from_a_controller_without_the_testbed(wheel_venv, tmp_path):
    """The repository's own inventories/prod.py and group_data/, run from a controller that has the
    nemofleet wheel and not the testbed (pyinfra runs every file of group_data/ for any inventory):
    no traceback and no word of the testbed; without facts each example host fails alone, in one
    sentence, on being reached; from a facts file every host is planned."""
    from test_desired import facts

    bin_ = wheel_venv / "bin"
    env = dict(ENV, PATH=f"{bin_}:{ENV.get('PATH', '')}", HOME=str(tmp_path), PYINFRA_PROGRESS="off")
    for k in ("NEMOFLEET_API_KEY_FILE", "NEMOFLEET_HF_TOKEN_FILE", "HF_ENDPOINT"):
        env.pop(k, None)
    hosts = ["a100-01.example.internal", "h100-01.example.internal", "h100-02.example.internal",
             "h200-01.example.internal"]

    def run(*cmd):
        r = subprocess.run([str(bin_ / cmd[0]), *cmd[1:]], capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=300, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
        assert "Traceback" not in out and "testbed" not in out.lower(), out[-3000:]
        return r.returncode, out

    rc, out = run("nemofleet", "plan", "inventories/prod.py")
    assert rc != 0
    for h in hosts:  # one line each, naming the host and why it was not reached
        lines = [line for line in out.splitlines() if h in line]
        assert len(lines) == 1 and "resolve" in lines[0], out
    h100 = facts(gpus=8, name="NVIDIA H100 80GB HBM3", mib=81559, docker="24.0.7")
    (tmp_path / "facts.json").write_text(json.dumps({
        "a100-01.example.internal": facts(name="NVIDIA A100-SXM4-80GB", mib=81920, cc="8.0", docker="20.10.24",
                                          driver="570.195.03", cgroup=1, cgroup_driver="cgroupfs"),
        "h100-01.example.internal": h100, "h100-02.example.internal": h100, "h200-01.example.internal": facts()}))
    rc, out = run("nemofleet", "plan", "inventories/prod.py", "--facts", str(tmp_path / "facts.json"))
    assert rc == 1, out  # the example data sets no API key: each host is refused for that, and planned
    for h in hosts:
        assert f"== {h}" in out, out
    assert "nemotron-3.5-super-vl" in out and "REFUSED: no API key" in out, out
    rc, out = run("pyinfra", "--dry", "inventories/prod.py", "deploys/nemotron.py")
    assert rc != 0
    for h in hosts:
        assert any(h in line and "resolve" in line for line in out.splitlines()), out
