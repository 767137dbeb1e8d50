"""CDI end to end on cdi-1: Debian 13's Docker 26 and toolkit 1.17.8 with no spec yet. nemofleet
enables CDI in daemon.json (a restart), generates the spec, and the units and the GPU probe
request the GPUs as CDI devices; no legacy hook is involved, so daemon-reload takes nothing."""
import json

import pytest

from conftest import on, optional_host, pyinfra

pytestmark = pytest.mark.e2e
HOST = "cdi-1"
UUID = "GPU-cd1c0de0-0000-4000-8000-000000000001"


cdi = optional_host(HOST)


def test_cdi_host_converges_with_cdi_devices_and_keeps_gpus_across_daemon_reload(cdi):
    assert on(HOST, "docker version -f '{{.Server.Version}}'").stdout.startswith("26.")
    r = pyinfra(hosts=[HOST])
    assert r.rc == 0, r.out[-6000:]
    changed = " ".join(r.changed())
    assert "Generate the CDI spec" in changed and "GPU access survives" in changed
    daemon = json.loads(on(HOST, "cat /etc/docker/daemon.json").stdout)
    assert daemon["features"] == {"cdi": True}
    assert "exec-opts" not in daemon  # no cgroup remedy with CDI
    assert f"nvidia.com/gpu={UUID}" in on(HOST, "nvidia-ctk cdi list").stdout
    unit = on(HOST, "systemctl cat nemofleet-vllm-nemotron-0").stdout
    assert f"--device=nvidia.com/gpu={UUID}" in unit and "--gpus" not in unit
    # Docker >= 25: every frontend network is given to docker run itself
    assert "--network=name=open-webui_default,alias=nemotron" in unit and "docker network connect" not in unit
    before = on(HOST, "docker exec nemotron-0 nvidia-smi -L").stdout
    assert before.startswith(f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUID})"), before
    on(HOST, "systemctl daemon-reload")
    assert on(HOST, "docker exec nemotron-0 nvidia-smi -L").stdout == before
    again = pyinfra(hosts=[HOST])
    assert again.rc == 0 and again.changed() == [], again.changed()
