"""Nothing a host or an input says runs as code, and secrets never leave their file (issue 36), shown
on the testbed: a payload is planted in each class of input the audit found (a GPU UUID nvidia-smi
reports, the fleet seed key file, vLLM extra-arg values, path settings, a Hugging Face mirror that
redirects elsewhere; a serving-group head's own facts are in test_9_multinode.py). Each payload would
create a marker file if any shell, systemd line or program ran it: the marker never appears on any
host, and the redirect's other end never sees the token. Then every secret of the test fleet is
searched for in every output and every readable file nemofleet writes: found nowhere."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest
from conftest import ROOT, on, pyinfra

pytestmark = pytest.mark.e2e
NEMOFLEET = str(Path(sys.executable).with_name("nemofleet"))
HOSTS = ["a100-1", "h100-1", "h200-1"]
HOST = "h200-1"
# where a payload's `touch` would land: /tmp, or the home directory of whoever ran it (a payload
# that cannot hold a slash says `cd; touch nf-pwned`)
MARKERS = "/tmp/nf-pwned /root/nf-pwned"
PAYLOADS = ["$(touch /tmp/nf-pwned)", "`touch /tmp/nf-pwned`", "x; touch /tmp/nf-pwned", "x\ntouch /tmp/nf-pwned",
            "$(cd;touch${IFS}nf-pwned)"]
STATE = ("md5sum /etc/systemd/system/nemofleet-vllm-*.service /etc/docker/daemon.json /etc/cron.d/nemofleet-health "
         "/root/.ssh/authorized_keys 2>/dev/null; docker inspect -f '{{.Id}}' nemotron-0")


def no_marker_anywhere() -> None:
    for h in HOSTS:
        r = on(h, f"ls -d {MARKERS} 2>/dev/null", check=False)
        assert r.stdout.strip() == "", f"a payload ran on {h}: {r.stdout}"


def nemofleet(*args, timeout=900):
    r = subprocess.run([NEMOFLEET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout + r.stderr


def refused_alone(data: dict, words: str) -> str:
    """A converge of HOST and a100-1 with `data` refuses HOST in one sentence containing `words`,
    changes nothing on either, prints no traceback; the marker appears nowhere."""
    before = {h: on(h, STATE).stdout for h in (HOST, "a100-1")}
    r = pyinfra(hosts=[HOST, "a100-1"], data=data)
    assert r.rc == 1, r.out[-3000:]
    line = next((x for x in r.out.splitlines() if f"nemofleet refused {HOST}:" in x), "")
    assert words in line, r.out[-3000:]
    assert "Traceback" not in r.out and r.changed() == [], r.out[-3000:]
    assert {h: on(h, STATE).stdout for h in (HOST, "a100-1")} == before
    no_marker_anywhere()
    return line


@pytest.fixture(autouse=True)
def clean_markers(converged):
    for h in HOSTS:
        on(h, f"rm -f {MARKERS}")
    yield


# --- a GPU UUID as nvidia-smi reports it ------------------------------------------------------------

@pytest.mark.parametrize("uuid", [
    "GPU-5f2c0e9b-1111-2222-3333-444455556666,count=all",  # would split docker's --gpus device=...
    "GPU-$(touch /tmp/nf-pwned)",
    "GPU-`touch /tmp/nf-pwned`",
    "GPU-1; touch /tmp/nf-pwned",
])
def test_a_gpu_uuid_payload_refuses_that_host_alone_and_never_runs(uuid, changes):
    profile = "/etc/nemofleet-sim/profile.json"
    on(HOST, f"cp {profile} {profile}.payload-test")
    changes.undo(lambda: on(HOST, f"mv {profile}.payload-test {profile}"))
    on(HOST, "python3 - <<'EOF'\nimport json, sys\np = '/etc/nemofleet-sim/profile.json'\nd = json.load(open(p))\n"
             f"d['gpus'][0]['uuid'] = {uuid!r}\njson.dump(d, open(p, 'w'))\nEOF")
    assert uuid in on(HOST, "nvidia-smi --query-gpu=uuid --format=csv,noheader").stdout
    refused_alone({}, "gpus")
    # the health program on the host reads the same UUIDs from nvidia-smi every minute (cron)
    health = on(HOST, "/usr/local/bin/nemofleet-health", check=False)
    assert "Traceback" not in health.stdout + health.stderr, health.stdout + health.stderr
    rc, out = nemofleet("plan", "inventories/testbed.py", "--limit", HOST)
    assert "Traceback" not in out and rc in (0, 1), out
    rc, out = nemofleet("status", "inventories/testbed.py", "--limit", HOST)
    assert "Traceback" not in out, out
    no_marker_anywhere()


# --- the fleet seed key file ---------------------------------------------------------------------------

def _seed_pub() -> str:
    return (conftest.testbed.testbed_dir() / "seed_ed25519.pub").read_text().strip()


@pytest.mark.parametrize("shape", ["two keys", "options before the key", "a key and a shell line"])
def test_a_seed_key_file_that_is_not_exactly_one_key_is_refused(shape, tmp_path):
    real = _seed_pub()
    other = real.split()[0] + " " + real.split()[1][:-4] + "AAAA evil@payload"
    text = {"two keys": f"{real}\n{other}\n",
            "options before the key": f'command="touch /tmp/nf-pwned" {real}\n',
            "a key and a shell line": f"{real}\n$(touch /tmp/nf-pwned)\n"}[shape]
    f = tmp_path / "seed.pub"
    f.write_text(text)
    keys = on(HOST, "cat /root/.ssh/authorized_keys").stdout
    refused_alone({"weights_seed_public_key_file": str(f)}, "weights_seed_public_key_file")
    assert on(HOST, "cat /root/.ssh/authorized_keys").stdout == keys
    assert "evil@payload" not in keys and "nf-pwned" not in keys


def test_the_seed_key_is_authorised_restricted_to_a_read_only_rsync_of_the_models():
    line = next(x for x in on(HOST, "cat /root/.ssh/authorized_keys").stdout.splitlines() if _seed_pub().split()[1] in x)
    # rrsync -ro: the forced command serves the models directory read-only, whatever the client asks
    assert line.startswith("restrict,") and 'command="/usr/bin/rrsync -ro /srv/nemofleet/models"' in line, line
    assert 'from="' in line, line


# --- vLLM extra-arg values ---------------------------------------------------------------------------

@pytest.mark.parametrize("payload", PAYLOADS)
def test_an_extra_arg_value_reaches_vllm_as_one_literal_word(payload, changes):
    """A value the flag takes as free text (--chat-template: a path or the template itself) carrying
    a payload: the unit starts the container with it as one argument, and nothing runs it. A value
    of more than one line is refused in one sentence instead."""
    extra = json.dumps({"--chat-template": payload})
    if "\n" in payload:
        refused_alone({"vllm_extra_args": extra}, "vllm_extra_args")
        return
    r = pyinfra(hosts=[HOST], data={"vllm_extra_args": extra})
    changes.made(HOST, "an extra-arg payload deployed")
    assert r.rc == 0, r.out[-3000:]
    args = json.loads(on(HOST, "docker inspect -f '{{json .Args}}' nemotron-0").stdout)
    assert args[args.index("--chat-template") + 1] == payload, args
    no_marker_anywhere()
    inside = on(HOST, "docker exec nemotron-0 ls -d /tmp/nf-pwned /root/nf-pwned 2>/dev/null", check=False)
    assert inside.stdout.strip() == "", inside.stdout
    back = pyinfra(hosts=[HOST])  # its own way back: the inventory's flags
    assert back.rc == 0 and "--chat-template" not in on(HOST, "docker inspect -f '{{json .Args}}' nemotron-0").stdout


@pytest.mark.parametrize("extra, words", [
    ({"--chat-template": "--enforce-eager"}, "--chat-template"),  # a value that is itself a flag
    ({"--middleware": "os.system"}, "--middleware"),  # loads code by name
    ({"--api-key": "$(touch /tmp/nf-pwned)"}, "--api-key"),  # a secret on argv
    ({"--host": "0.0.0.0; touch /tmp/nf-pwned"}, "--host"),  # where it listens is the plan's
])
def test_an_extra_arg_of_a_refused_class_is_one_sentence_and_changes_nothing(extra, words):
    line = refused_alone({"vllm_extra_args": json.dumps(extra)}, words)
    assert "nf-pwned" not in line or "--api-key" not in line  # a secret value is never echoed


# --- path settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("models_root", "/srv/m$(touch /tmp/nf-pwned)"),
    ("models_root", "/"),
    ("models_root", "/etc"),
    ("models_root", "/srv/../etc/nemofleet"),
    ("models_root", "srv/models"),
    ("prom_dir", "/var/lib/x;touch /tmp/nf-pwned"),
    ("prom_dir", "/var/lib/prometheus/../../../etc"),
])
def test_a_path_setting_outside_its_confines_is_refused(key, value):
    refused_alone({key: value}, key)


# --- a mirror that redirects elsewhere -------------------------------------------------------------

RECORDER = textwrap.dedent("""\
    import http.server, json, sys
    port, target, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    class H(http.server.BaseHTTPRequestHandler):
        def _any(self):
            with open(log, "a") as f:
                f.write(json.dumps({"path": self.path, "headers": dict(self.headers)}) + "\\n")
            if target != "-":
                self.send_response(302)
                self.send_header("Location", target + self.path)
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()
        do_GET = do_HEAD = _any
        def log_message(self, *a):
            pass
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """)


@pytest.fixture
def redirecting_mirror():
    """On HOST: a 'mirror' on 127.0.0.1:9901 that answers every request with a redirect to another
    origin, 127.0.0.1:9902, which records what it receives (both log to files read back here)."""
    on(HOST, f"cat > /tmp/nf-recorder.py <<'EOF'\n{RECORDER}EOF\nrm -f /tmp/nf-9901.log /tmp/nf-9902.log")
    pids = []
    for port, target in ((9902, "-"), (9901, "http://127.0.0.1:9902")):
        pid = on(HOST, f"nohup python3 /tmp/nf-recorder.py {port} {target} /tmp/nf-{port}.log "
                       f">/dev/null 2>&1 & echo $!").stdout.strip()
        pids.append(pid)
    conftest.wait_for("the recorders to listen", lambda: (
        on(HOST, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9902/ping", check=False).stdout == "404",
        "not yet"), timeout=30, every=0.5)
    on(HOST, "rm -f /tmp/nf-9901.log /tmp/nf-9902.log")
    yield lambda port: [json.loads(x) for x in on(HOST, f"cat /tmp/nf-{port}.log 2>/dev/null",
                                                    check=False).stdout.splitlines() if x.strip()]
    for pid in pids:  # only the processes this fixture started, by their PID
        on(HOST, f"kill {pid}", check=False)
    on(HOST, "rm -f /tmp/nf-recorder.py /tmp/nf-9901.log /tmp/nf-9902.log")


@pytest.mark.parametrize("revision, asks", [
    ("nemofleet-no-such-branch", "the commit of a branch name"),
    ("c" * 40, "the file list of a commit not on the host (the download precheck)"),
])
def test_a_mirror_redirect_to_another_origin_never_carries_the_token(redirecting_mirror, changes, revision, asks):
    token = (conftest.testbed.testbed_dir() / "hf-token").read_text().strip()
    model = json.dumps({"catalog": "nemotron-3.5-lightning-nvfp4", "revision": revision})
    r = pyinfra(hosts=[HOST], data={"model": model, "hf_endpoint": "http://127.0.0.1:9901"})
    changes.made(HOST, f"a deploy against a redirecting mirror ({asks})")
    assert "Traceback" not in r.out, r.out[-3000:]
    first, other = redirecting_mirror(9901), redirecting_mirror(9902)
    assert first, f"the host never asked the mirror for {asks}: {r.out[-3000:]}"
    # the mirror nemofleet was told to use gets the token; the origin it redirects to never does
    assert any(token in json.dumps(x) for x in first), first
    assert not any(token in json.dumps(x) for x in other), other
    assert not any("authorization" in {k.lower() for k in x["headers"]} for x in other), other
    assert token not in r.out
    no_marker_anywhere()
    back = pyinfra(hosts=[HOST])
    assert back.rc == 0, back.out[-3000:]


# --- every secret of the test fleet, searched everywhere ----------------------------------------------

def _secrets() -> dict[str, str]:
    d = conftest.testbed.testbed_dir()
    found = {"API key": (d / "api-key").read_text().strip(), "HF token": (d / "hf-token").read_text().strip()}
    for name in ("seed_ed25519", "id_ed25519"):  # private keys: any line of their body
        body = [x for x in (d / name).read_text().splitlines() if x and not x.startswith("-----")]
        found[f"{name} private key"] = max(body, key=len)
    return found


def test_no_secret_appears_in_any_output_or_readable_file(changes, tmp_path):
    secrets = _secrets()
    assert all(len(v) >= 16 for v in secrets.values()), secrets.keys()
    outputs = {}
    outputs["plan"] = nemofleet("plan", "inventories/testbed.py")[1]
    outputs["plan --json"] = nemofleet("plan", "inventories/testbed.py", "--json")[1]
    outputs["plan -v"] = nemofleet("plan", "inventories/testbed.py", "-v")[1]
    # a change that rewrites the 0600 files holding the API key, shown with --diff, then put back
    r = pyinfra(hosts=[HOST], data={"health_check_infer": "false"}, extra=["--diff", "-v"])
    changes.made(HOST, "a health setting changed")
    outputs["deploy --diff"] = r.out
    assert r.rc == 0, r.out[-3000:]
    # a proxy with credentials: its dockerd drop-in is a 0600 file, shown in a dry run with --diff
    outputs["deploy --dry --diff (proxy)"] = pyinfra(
        hosts=[HOST], data={"http_proxy": "http://nfuser:Pr0xyPassw0rd-secret@10.9.9.9:3128"},
        extra=["--dry", "--diff", "-vv"]).out
    secrets["proxy password"] = "Pr0xyPassw0rd-secret"
    outputs["deploy --diff (back)"] = pyinfra(hosts=[HOST], extra=["--diff"]).out
    outputs["status"] = nemofleet("status", "inventories/testbed.py")[1]
    outputs["status --json"] = nemofleet("status", "inventories/testbed.py", "--json")[1]
    rc, outputs["rollout"] = nemofleet("rollout", "inventories/testbed.py", "--limit", HOST, "--bake", "0",
                                       "--wait", "120", "--data", "vllm_image=vllm/vllm-openai:v0.27.1-nf2")
    assert rc == 0, outputs["rollout"][-3000:]
    rc, outputs["rollback"] = nemofleet("rollback", "inventories/testbed.py", "--limit", HOST, "--wait", "120")
    assert rc == 0, outputs["rollback"][-3000:]
    outputs["smoke"] = nemofleet("smoke", "inventories/testbed.py", "--limit", HOST)[1]
    for h in HOSTS:
        outputs[f"{h}: journal"] = on(h, "journalctl --no-pager -o cat 2>/dev/null | tail -n 20000").stdout
        outputs[f"{h}: processes"] = on(h, "ps axww -o args").stdout
        # every file nemofleet writes that is not 0600, and the cron, units and audit log
        outputs[f"{h}: readable files"] = on(
            h, "find /etc/nemofleet /etc/systemd /etc/cron.d /etc/haproxy /var/lib/nemofleet /usr/local/bin "
               "/etc/docker -xdev -type f ! -perm 600 -size -4M -print0 2>/dev/null | xargs -0 -r cat 2>/dev/null"
        ).stdout
        # the containers' command lines (argv is readable by every user of the host); their
        # environment is not searched: vLLM reads its key from VLLM_API_KEY, which the unit passes
        # with --env-file from the 0600 file, and `docker inspect` of it is root's, like that file
        outputs[f"{h}: container command lines"] = on(
            h, "docker inspect -f '{{.Path}} {{json .Args}}' $(docker ps -q) 2>/dev/null", check=False).stdout
    found = [f"{what} in {where}" for where, text in outputs.items() for what, v in secrets.items() if v in text]
    assert found == [], found
    back = pyinfra(hosts=[HOST])
    assert back.rc == 0 and pyinfra(hosts=[HOST]).changed() == [], back.out[-3000:]
