"""remote/health.py run as the hosts run it (`nemofleet-health CONFIG`), against stub tools: the
serving group's head address and a GPU's UUID are data (never a shell word, never a path out of the
state directory), knobs come from the environment and the 0600 conf (KEY=value, never sourced),
the self-heal is bounded, and a broken config is one sentence. test_gpu_watch.py, test_status.py
and test_destinations.py run it too (GPU watch, load figures, hostile served names)."""
import json
import os
import socket
import subprocess
import sys

from nemofleet import render, settings
from nemofleet.plan import Gpu
from opharness import make_plan  # noqa: E402

GPUS = [Gpu(i, f"GPU-{i:08d}-aaaa-4000-8000-000000000000", "NVIDIA H100 80GB HBM3", 81559, "9.0",
            bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(2)]

STUBS = {
    # /health answers $HEALTH (200 unless set), /v1/models lists $MODEL; the webhook (-K -) is recorded
    "curl": """#!/bin/sh
for a in "$@"; do last=$a; done
echo "$*" >> "$T/curl.calls"
case " $* " in
  *" -K - "*) sed 's/^/config: /' >> "$T/webhook.calls"; echo "args: $*" >> "$T/webhook.calls"; exit 0 ;;
esac
case "$last" in
  */health) printf "${HEALTH:-200}" ;;
  */v1/models) printf '{"data": [{"id": "%s"}]}' "$MODEL" ;;
  *) exit 22 ;;
esac
""",
    "systemctl": "#!/bin/sh\necho \"$*\" >> \"$T/systemctl.calls\"\nexit ${ACTIVE:-0}\n",
    "nvidia-smi": "#!/bin/sh\ncat \"$T/smi.out\"\n",
    "dmesg": "#!/bin/sh\nexit 0\n",
}


def setup(tmp_path, plan=None, conf="", **change):
    plan = plan or make_plan("h100-1", GPUS, {})
    config = json.loads(render.health_config(plan, settings.parse({})))
    config.update({"state_dir": str(tmp_path / "state"), "conf": str(tmp_path / "health.conf"),
                   "auth_header": str(tmp_path / "none"), "resets_file": str(tmp_path / "resets"), **change})
    (tmp_path / "health.json").write_text(json.dumps(config))
    (tmp_path / "health.conf").write_text(conf)
    (tmp_path / "health.py").write_text(render.health_program())
    (tmp_path / "bin").mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (tmp_path / "bin" / name).write_text(body)
        (tmp_path / "bin" / name).chmod(0o755)
    (tmp_path / "smi.out").write_text("")
    return plan


def run(tmp_path, plan, config="health.json", **env):
    e = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "T": str(tmp_path), "PROM_DIR": str(tmp_path / "prom"),
         "MODEL": plan.served_name, **env}
    r = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "health.py"), str(tmp_path / config)],
                       capture_output=True, text=True, env=e, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def lines(tmp_path, name):
    p = tmp_path / f"{name}.calls"
    return p.read_text().splitlines() if p.exists() else []


def test_the_program_is_the_file_and_its_config_is_json():
    plan = make_plan("h100-1", GPUS, {})
    program = render.health_program()
    from pathlib import Path
    from nemofleet import remote
    assert program.startswith("#!/usr/bin/python3 -IS\n")  # -I -S, as the other host programs run
    # no template: the file itself, with the prelude every host program gets after its #! line
    assert program == remote.source("health")
    assert program.endswith((Path(remote.__file__).parent / "health.py").read_text().split("\n", 1)[1])
    config = json.loads(render.health_config(plan, settings.parse({"health_webhook_url": "https://hook.example/x"})))
    assert [i["name"] for i in config["instances"]] == ["nemotron-0", "nemotron-1"]
    assert config["gpus"][1] == {"instance": "nemotron-1", "uuid": GPUS[1].uuid} and config["group"] is None
    assert "hook.example" not in json.dumps(config)  # the webhook URL is in health.conf (0600) only
    conf = render.health_conf(settings.parse({"health_webhook_url": "https://hook.example/x"}))
    assert conf.splitlines()[1] == "DEFAULT_WEBHOOK_URL=https://hook.example/x"


def test_a_healthy_host_and_its_metrics(tmp_path):
    plan = setup(tmp_path)
    r = run(tmp_path, plan)
    assert r.returncode == 0 and "instance nemotron-0 healthy (" in r.stdout, r.stdout
    prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
    assert 'nemofleet_vllm_up{instance="nemotron-1",model="%s",port="8001"} 1' % plan.served_name in prom
    assert "# TYPE nemofleet_vllm_self_heal_restarts_total counter" in prom
    assert prom.rstrip().splitlines()[-1].startswith("nemofleet_health_last_run_timestamp_seconds ")
    assert (tmp_path / "state" / "nemotron-0.state").read_text() == "up\n"


def test_knobs_from_the_conf_file_win_and_it_is_never_run(tmp_path):
    pwned = tmp_path / "pwned"
    plan = setup(tmp_path, conf=f"# a comment\nDEFAULT_WEBHOOK_URL=http://hook.example/x\n"
                                f"FAIL_RESTART=1\n$(touch {pwned})\ntouch {pwned}\nRESTART_GRACE='0'\n")
    run(tmp_path, plan)
    r = run(tmp_path, plan, HEALTH="503", FAIL_RESTART="0")
    assert r.returncode == 1 and "UNHEALTHY: /health returned 503 (failure 1)" in r.stdout
    assert "restarting nemofleet-vllm-nemotron-0.service after 1 consecutive failures" in r.stdout  # the conf's 1
    assert not pwned.exists()
    hooks = [h for h in lines(tmp_path, "webhook") if h.startswith("config: ")]
    assert hooks and hooks[0] == 'config: url = "http://hook.example/x"'  # on stdin, from the conf
    assert all("hook.example" not in c for c in lines(tmp_path, "curl") if " -K - " in c)


def test_self_heal_is_capped_per_hour(tmp_path):
    plan = setup(tmp_path)
    env = {"HEALTH": "000", "FAIL_RESTART": "1", "RESTART_GRACE": "0", "RESTARTS_PER_HOUR": "1"}
    r = run(tmp_path, plan, **env)
    assert "instance nemotron-0: restarting nemofleet-vllm-nemotron-0.service after 1 consecutive failures" in r.stdout
    r = run(tmp_path, plan, **env)
    assert "1 restarts in the last hour (cap 1); needs a person" in r.stdout
    assert [c for c in lines(tmp_path, "systemctl") if c.startswith("restart")] == [
        "restart nemofleet-vllm-nemotron-0.service", "restart nemofleet-vllm-nemotron-1.service"]
    prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
    assert 'nemofleet_vllm_self_heal_restarts_total{instance="nemotron-0"} 1' in prom


def test_a_headless_worker_reaches_its_head_as_data_never_as_a_shell_word(tmp_path):
    pwned = tmp_path / "pwned"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    plan = setup(tmp_path, instances=[{"name": "nemotron-svl", "port": 0, "model": "m", "unit": "u.service"}],
                 gpus=[], group={"name": "svl", "role": "worker", "rank": 1, "head": "127.0.0.1", "port": port})
    r = run(tmp_path, plan)
    assert r.returncode == 0 and "instance nemotron-svl healthy" in r.stdout, r.stdout
    prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
    assert 'nemofleet_serving_group_member_up{group="svl",role="worker",rank="1",instance="nemotron-svl"} 1' in prom
    listener.close()
    for head in ("127.0.0.1", f"1.2.3.4/$(touch {pwned})", f"fe80::1%$(touch {pwned})", "x;touch " + str(pwned)):
        setup(tmp_path, instances=[{"name": "nemotron-svl", "port": 0, "model": "m", "unit": "u.service"}],
              gpus=[], group={"name": "svl", "role": "worker", "rank": 1, "head": head, "port": port})
        r = run(tmp_path, plan)
        assert r.returncode == 1 and "does not answer: the group is down" in r.stdout
    assert not pwned.exists()
    r = run(tmp_path, plan, ACTIVE="3")
    assert "headless worker of serving group svl: u.service is not active" in r.stdout


def test_a_gpu_uuid_of_an_unknown_shape_never_names_a_file(tmp_path):
    plan = setup(tmp_path)
    fields = json.loads(render.health_config(plan, settings.parse({})))["gpu_fields"]
    row = {f: "N/A" for f in fields}
    row.update({"index": "0", "uuid": "../../escaped", "pci.bus_id": "00000000:18:00.0",
                "remapped_rows.failure": "Yes"})
    (tmp_path / "smi.out").write_text(", ".join(row[f] for f in fields) + "\n")
    r = run(tmp_path, plan)
    assert "UUID nemofleet does not know the shape of" in r.stdout
    assert not list(tmp_path.glob("**/escaped*")) and not (tmp_path / "escaped.sick").exists()
    prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
    assert 'nemofleet_gpu_healthy{gpu="0",UUID="../../escaped",' in prom  # reported, as data


def test_label_values_are_escaped(tmp_path):
    plan = setup(tmp_path, instances=[{"name": "nemotron-0", "port": 8000, "model": 'a"b\\c\nd', "unit": "u"}])
    run(tmp_path, plan, MODEL='a"b\\c\nd')
    prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
    assert 'model="a\\"b\\\\c\\nd"' in prom


def test_a_missing_or_broken_config_is_one_sentence(tmp_path):
    plan = setup(tmp_path)
    r = run(tmp_path, plan, config="absent.json")
    assert r.returncode == 1 and "cannot read its config" in r.stdout and "run the nemofleet deploy again" in r.stdout
    (tmp_path / "bad.json").write_text("{not json")
    assert "cannot read its config" in run(tmp_path, plan, config="bad.json").stdout


def test_with_real_curl_against_a_local_server_the_key_and_the_webhook(tmp_path):
    """No stubs for HTTP: real curl against a local vLLM-like server (the API key header read from
    its 0600 file, the inference probe) and a webhook receiver that records what it gets."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self, body, status=200):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            seen.append(("GET", self.path, self.headers.get("Authorization")))
            if self.path == "/health":
                self.answer({}, 200 if not seen_down() else 503)
            elif self.path == "/v1/models":
                self.answer({"data": [{"id": "nemotron"}]})
            elif self.path == "/metrics":
                data = b'vllm:num_requests_running{engine="0"} 2.0\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self.answer({}, 404)

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            seen.append(("POST", self.path, self.headers.get("Authorization"), body))
            self.answer({"choices": [{"message": {"content": "OK"}}]})

        def log_message(self, *a):
            pass

    down = tmp_path / "down"

    def seen_down():
        return down.exists()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        plan = make_plan("h100-1", GPUS[:1], {})
        setup(tmp_path, conf=f"DEFAULT_WEBHOOK_URL=http://127.0.0.1:{port}/hook\n", address="127.0.0.1",
              instances=[{"name": "nemotron-0", "port": port, "model": "nemotron", "unit": "u.service"}],
              auth_header=str(tmp_path / "api-auth.header"))
        (tmp_path / "api-auth.header").write_text("Authorization: Bearer k3y\n")
        (tmp_path / "bin" / "curl").unlink()  # the real one
        env = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "CHECK_INFER": "1"}
        r = run(tmp_path, plan, **env)
        assert r.returncode == 0 and "instance nemotron-0 healthy" in r.stdout, r.stdout + r.stderr
        assert ("GET", "/v1/models", "Bearer k3y") in seen and ("GET", "/health", None) in seen
        probe = [s for s in seen if s[0] == "POST" and s[1] == "/v1/chat/completions"]
        assert probe and probe[0][2] == "Bearer k3y" and json.loads(probe[0][3])["model"] == "nemotron"
        prom = (tmp_path / "prom" / "nemofleet.prom").read_text()
        assert 'nemofleet_vllm_num_requests_running{instance="nemotron-0"} 2' in prom
        assert 'nemofleet_vllm_kv_cache_usage_ratio{instance="nemotron-0"} 0.25' in prom
        down.touch()
        r = run(tmp_path, plan, **env)
        assert r.returncode == 1 and "UNHEALTHY: /health returned 503 (failure 1)" in r.stdout
        hooks = [s for s in seen if s[0] == "POST" and s[1] == "/hook"]
        assert len(hooks) == 1 and hooks[0][2] is None  # the API key never goes to the webhook
        assert json.loads(hooks[0][3]) == {"host": "h100-1", "instance": "nemotron-0", "state": "down",
                                           "reason": "/health returned 503"}
        assert str(port) + "/hook" not in " ".join(json.dumps(s) for s in seen if s[1] != "/hook")
    finally:
        server.shutdown()
        server.server_close()
