"""A non-editable install (a wheel in a fresh venv, as on a controller or a GPU host) can plan and
render: the templates travel inside the wheel and are read with importlib.resources."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the installed wheel alone: a caller's PYTHONPATH (a checkout's src) would make pip skip the install
# and the venv import the checkout
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

SCRIPT = r"""
import nemofleet, pathlib
from nemofleet import render, settings
from nemofleet.plan import Gpu, make_plan
assert "site-packages" in nemofleet.__file__, nemofleet.__file__
p = make_plan("h", [Gpu(0, "GPU-0", "NVIDIA H200", 143771, "9.0")], {})
unit = render.unit(p, p.instances[0], [], 29)
assert "ExecStart=/usr/bin/docker run" in unit and settings.DEFAULT_IMAGE in unit
assert '"instances"' in render.health_config(p, settings.defaults()) and "def run_once" in render.health_program()
from nemofleet import remote  # the host programs travel in the wheel too
assert all("__main__" in remote.source(n) for n in ("weights_check", "models_on_disk", "hub", "engine_read", "health",
                                                  "lock", "release", "gpu_return", "host_status"))
print("rendered", len(unit))
"""


@pytest.mark.skipif(not (ROOT / "pyproject.toml").exists(), reason="needs the source tree")
def test_wheel_in_a_fresh_venv_plans_and_renders(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = wheels.glob("nemofleet-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(py), "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0 and "rendered" in r.stdout, r.stdout + r.stderr
