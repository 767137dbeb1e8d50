"""Rendered units: systemd quoting, GPU selection, network forms per Docker version."""
import shlex

from nemofleet.plan import Gpu
from opharness import make_plan  # noqa: E402
from nemofleet.render import health_cron, release_id, systemd_word, unit
from nemofleet import settings
from nemofleet.settings import defaults

GPUS = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, "9.0") for i in range(2)]
FRONTENDS = settings.parse({"frontends": [{"network": "open-webui_default", "alias": "nemotron"},
                                          {"network": "dify_default", "alias": "nemotron"}]}).frontends


def systemd_split(line: str) -> list[str]:
    """Enough of systemd's ExecStart word splitting (quotes removed, %% and $$ unescaped)."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


def test_systemd_word_keeps_json_and_quotes():
    for word in ['{"method":"mtp","num_speculative_tokens":3}', '"device=GPU-0,GPU-1"', "50%", "a b", "$HOME"]:
        assert systemd_split(systemd_word(word)) == [word]
    assert systemd_word("--port") == "--port"


def test_unit_docker_25_plus_uses_run_with_all_networks():
    p = make_plan("h", GPUS, {"tensor_parallel_size": 2, "speculative": "mtp"})
    text = unit(p, p.instances[0], FRONTENDS, 29)
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    words = systemd_split(line[len("ExecStart="):])
    assert words[:4] == ["/usr/bin/docker", "run", "--rm", "--name=nemotron-0"]
    assert "--pull=never" in words and "--network=name=open-webui_default,alias=nemotron" in words
    assert words[words.index("--gpus") + 1] == '"device=GPU-0,GPU-1"'
    assert '{"method":"mtp","num_speculative_tokens":3}' in words
    assert "--env-file=/etc/nemofleet/vllm.env" in words and "-p" in words and "127.0.0.1:8000:8000" in words
    assert "serve" not in words  # the image's entrypoint is `vllm serve`
    assert "ExecStartPre=-/usr/bin/docker rm -f nemotron-0" in text
    assert "ExecStop=/usr/bin/docker stop -t 60 nemotron-0" in text and "TimeoutStopSec=90" in text
    assert "Requires=docker.service" in text and "Restart=always" in text and "TimeoutStartSec=1800" in text


def test_unit_docker_20_creates_connects_starts():
    p = make_plan("h", GPUS[:1], {})
    text = unit(p, p.instances[0], FRONTENDS, 20)
    assert "ExecStartPre=/usr/bin/docker network connect --alias nemotron dify_default nemotron-0" in text
    assert "ExecStart=/usr/bin/docker start -a nemotron-0" in text
    create = next(x for x in text.splitlines() if x.startswith("ExecStartPre=/usr/bin/docker create"))
    assert "--network=open-webui_default" in create and "--network-alias=nemotron" in create


def test_cdi_devices():
    p = make_plan("h", GPUS, {"tensor_parallel_size": 2}, docker_version="29.1.3", cdi_available=True)
    text = unit(p, p.instances[0], [], 29)
    assert "--device=nvidia.com/gpu=GPU-0 --device=nvidia.com/gpu=GPU-1" in text and "--gpus" not in text


def test_release_id_changes_with_flags_only():
    a = make_plan("h", GPUS, {})
    assert release_id(a) == release_id(make_plan("h", GPUS, {}))
    assert release_id(a) != release_id(make_plan("h", GPUS, {"max_num_seqs": 64}))


def test_cron_file_rules():
    text = health_cron(defaults())
    assert text.endswith("\n") and "SHELL=/bin/sh" in text and "flock -n" in text and "logger -t nemofleet-health" in text


def test_checks_reach_the_port_where_it_is_published():
    import json
    from nemofleet.render import health_config

    local = json.loads(health_config(make_plan("h", GPUS[:1], {}), defaults()))
    assert local["address"] == "127.0.0.1" and local["instances"][0]["port"] == 8000
    private = make_plan("h", GPUS[:1], {"bind_address": "10.1.2.3"})
    assert json.loads(health_config(private, defaults()))["address"] == "10.1.2.3"
    assert "-p 10.1.2.3:8000:8000" in unit(private, private.instances[0], [], 29)
    v6 = make_plan("h", GPUS[:1], {"bind_address": "fd00::12"})
    assert json.loads(health_config(v6, defaults()))["address"] == "[fd00::12]"
    assert "-p '[fd00::12]:8000:8000'" in unit(v6, v6.instances[0], [], 29)
