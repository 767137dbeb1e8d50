"""The Docker facts' one read of the Engine API (facts/engine.py), run for real: the read command
through `sh` and python3, against a unix socket that replays answers a test host's dockerd
20.10 gave (tests/fixtures/docker/*.http, whole HTTP answers as captured)."""

from __future__ import annotations

import json
import os
import sys
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from nemofleet.facts import engine
from nemofleet.facts.docker import ContainerNetworks, DockerInfo, ImageInfo, Networks
from nemofleet.facts.gpu import Unreadable

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "docker"
IMAGE = "vllm/vllm-openai:v0.27.1"
ANSWERS = {
    "/info": "info.http",
    f"/images/{IMAGE}/json": "image.http",
    "/networks/dify_default": "network.http",
    "/containers/nemotron-0/json": "container.http",
}


class FakeEngine:
    """A unix socket answering each GET with a captured answer (404 for anything else), or, with
    `hang`, reading the request and never answering. Records every request line."""

    def __init__(self, path: Path, hang: bool = False):
        self.path, self.hang, self.requests = path, hang, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            line = data.split(b"\r\n", 1)[0].decode("latin-1")
            self.requests.append(line)
            if self.hang:
                self.held.append(conn)  # never answered, never closed until the test ends
                continue
            path = line.split(" ")[1] if line.count(" ") >= 2 else ""
            name = ANSWERS.get(path)
            if name is None:
                kind = path.split("/")[1] if path.count("/") > 1 else "container"
                name = {"images": "image_absent.http", "networks": "network_absent.http"}.get(
                    kind, "container_absent.http")
            conn.sendall((FIX / name).read_bytes())
            conn.close()

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def dockerd(tmp_path):
    engines = []

    def start(hang=False):
        e = FakeEngine(tmp_path / "docker.sock", hang=hang)
        engines.append(e)
        return e
    yield start
    for e in engines:
        e.close()


def run(cmd: str, tmp_path: Path, sock: str | None = None, path: str | None = None) -> list[str]:
    env = {"PATH": path or os.environ["PATH"], "DOCKER_HOST": f"unix://{sock or tmp_path / 'docker.sock'}"}
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_each_docker_fact_reads_what_the_cli_showed(dockerd, tmp_path):
    dockerd()
    info = DockerInfo().process(run(DockerInfo().command(), tmp_path))
    assert info == {"installed": info["installed"], "running": True, "server": "20.10.24+dfsg1",
                    "cgroup_driver": "cgroupfs", "cgroup_version": 1, "default_runtime": "runc",
                    "runtimes": ["io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "nvidia", "runc"]}
    image = ImageInfo().process(run(ImageInfo().command(ref=IMAGE), tmp_path))
    assert image["id"].startswith("sha256:e1bfcd4e8b42") and image["env"]["CUDA_VERSION"] == "12.8.1"
    assert ImageInfo().process(run(ImageInfo().command(ref="vllm/vllm-openai:v0.1.0"), tmp_path)) is None
    assert Networks().process(run(Networks().command(names=("dify_default", "open-webui_default")), tmp_path)) == {
        "dify_default": True, "open-webui_default": False}
    got = ContainerNetworks().process(run(ContainerNetworks().command(names=("nemotron-0", "nemotron-1")), tmp_path))
    assert got == {"nemotron-0": {"running": True, "networks": {"dify_default": ["nemotron", "8a1d51b4e1de"],
                                                                "open-webui_default": ["nemotron", "8a1d51b4e1de"]}},
                   "nemotron-1": None}


def test_one_read_for_all_requests_and_names_quoted_in_the_request_line(dockerd, tmp_path):
    """Hostile names reach the engine as one %-quoted path each: no second request line, no
    header, nothing for the shell."""
    eng = dockerd()
    names = ("dify_default", "a b", "x\r\nHost: evil", "$(touch /tmp/pwned)", "../../info")
    cmd = Networks().command(names=names)
    assert cmd.count("python3 -I -S -c") == 1
    got = Networks().process(run(cmd, tmp_path))
    assert got == {"dify_default": True, "a b": False, "x\r\nHost: evil": False, "$(touch /tmp/pwned)": False,
                   "../../info": False}
    assert eng.requests == ["GET /networks/dify_default HTTP/1.0", "GET /networks/a%20b HTTP/1.0",
                            "GET /networks/x%0D%0AHost:%20evil HTTP/1.0",
                            "GET /networks/%24%28touch%20/tmp/pwned%29 HTTP/1.0", "GET /networks/../../info HTTP/1.0"]
    assert not Path("/tmp/pwned").exists()
    # a GET is all a name can make, and only an answer under the asked name counts (the body's
    # Name): "../../info" routed anywhere still reads as no such network


def test_a_key_with_whitespace_is_refused_before_any_command():
    with pytest.raises(ValueError, match="one printable word"):
        engine.request("network:a\nb", "/networks/a")


def test_no_engine_at_the_socket_reads_as_not_running_and_absent(tmp_path):
    info = DockerInfo().parse(run(DockerInfo().command(), tmp_path))
    assert info["running"] is False and info["server"] is None
    assert ImageInfo().parse(run(ImageInfo().command(ref=IMAGE), tmp_path)) is None
    assert Networks().parse(run(Networks().command(names=("dify_default",)), tmp_path)) == {"dify_default": False}
    assert ContainerNetworks().parse(run(ContainerNetworks().command(names=("nemotron-0",)), tmp_path)) == {
        "nemotron-0": None}
    out = run(DockerInfo().command(), tmp_path, sock="/nonexistent/docker.sock")
    assert any(x.startswith("@@engine down info ") for x in out)


def test_a_docker_host_that_is_not_a_unix_socket_is_said(tmp_path):
    env = {"PATH": os.environ["PATH"], "DOCKER_HOST": "tcp://10.0.0.1:2375"}
    out = subprocess.run(["sh", "-c", Networks().command(names=("n",))], capture_output=True, text=True, env=env,
                         timeout=30).stdout.splitlines()
    assert out == ["@@engine down network:n DOCKER_HOST=tcp://10.0.0.1:2375 is not a unix socket"]


def test_a_hung_engine_is_bounded_and_said(dockerd, tmp_path, monkeypatch):
    """An engine that takes the request and never answers: the read stops at its deadline (cut
    to 1 s here) and says so; the host is refused in one sentence, never waited on."""
    monkeypatch.setattr(engine, "ENGINE_TIMEOUT", 1)
    monkeypatch.setattr(engine, "PROCESS_TIMEOUT", 10)
    eng = dockerd(hang=True)
    out = run(DockerInfo().command(), tmp_path)
    assert "@@engine timeout info" in out and eng.requests == ["GET /info HTTP/1.0"]
    with pytest.raises(Unreadable, match="docker info did not answer within 1 s"):
        DockerInfo().parse(out)
    assert DockerInfo().process(out)["running"] is False
    out = run(ImageInfo().command(ref=IMAGE), tmp_path)
    with pytest.raises(Unreadable, match="docker image inspect did not answer"):
        ImageInfo().parse(out)
    assert ImageInfo().process(out) is None


def test_python3_missing_is_one_sentence(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("timeout", "sh", "printf"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found.startswith("/"):
            (bin_ / tool).symlink_to(found)
    (bin_ / "docker").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "docker").chmod(0o755)
    out = run(DockerInfo().command(), tmp_path, path=str(bin_))
    assert out == ["installed=1", "@@engine error python3"]
    with pytest.raises(Unreadable, match="python3 is not installed on the host"):
        DockerInfo().parse(out)
    assert Networks().process(out) == {} and ContainerNetworks().process(out) == {}


@pytest.mark.parametrize("lines, why", [
    ([], "printed nothing"),
    (["installed=1", "@@engine error timeout"], "did not answer within 20 s"),
    (["installed=1", "@@engine error failed"], "python3 exited with an error"),
])
def test_a_failed_read_is_a_sentence(lines, why):
    with pytest.raises(Unreadable, match=why):
        engine.answers(lines)


def test_answers_from_an_older_engine_and_odd_bodies():
    """docker 19.03 has no CgroupVersion; a body that is not JSON, or of the wrong shape, never
    raises past the fact."""
    out = ["installed=1", '@@engine 200 info {"ServerVersion":"19.03.15","CgroupDriver":"cgroupfs",'
           '"DefaultRuntime":"runc","Runtimes":{"runc":{"path":"runc"}}}']
    info = DockerInfo().parse(out)
    assert info["running"] and info["cgroup_version"] is None and info["runtimes"] == ["runc"]
    assert DockerInfo().parse(["installed=1", "@@engine 200 info not json"])["running"] is False
    assert DockerInfo().parse(["installed=1", '@@engine 500 info {"message":"oops"}'])["running"] is False
    assert DockerInfo().parse(["installed=1", '@@engine 200 info {"ServerVersion":7,"Runtimes":[1]}']) == {
        **DockerInfo().default(), "installed": True}
    assert ImageInfo().parse([f'@@engine 200 image:{IMAGE} {{"Id":"sha256:ab","Config":{{"Env":["A=1",2,"B"]}}}}']) == {
        "id": "sha256:ab", "env": {"A": "1"}}
    assert ImageInfo().parse([f'@@engine 200 image:{IMAGE} {{"Id":null}}']) is None
    assert ContainerNetworks().parse(['@@engine 200 container:c {"Name":"/other","State":{"Running":true}}']) == {
        "c": None}  # the API also answers an ID prefix: only the container of that name counts
    assert ContainerNetworks().parse(['@@engine 200 container:c {"Name":"/c","State":[],"NetworkSettings":'
                                      '{"Networks":{"n":{"Aliases":null}}}}']) == {
        "c": {"running": False, "networks": {"n": []}}}
    assert Networks().parse(['@@engine 200 network:n {"Name":"n-other"}']) == {"n": False}


def test_docker_cli_missing_is_not_installed_whatever_answers():
    assert DockerInfo().parse(["installed=0", "@@engine down info No such file or directory"]) == DockerInfo().default()


def test_a_combined_command_reads_the_engine_once(dockerd, tmp_path):
    """HostFacts and the prefetch batch: every Docker part shares one read (one python), and each
    part takes its own answers out of it."""
    from nemofleet.facts.host import HostFacts
    from nemofleet.facts.prefetch import Batch, ENGINE

    cmd = HostFacts().command(models_root="/srv/m", image=IMAGE)
    # the read, ModelsOnDisk, and the deploy lock's program (run only while a lock is there: hostcmd.lock_status)
    assert cmd.count("import _socket") == 1 and cmd.count("python3 -I -S -c") == 3
    parts = (("nemofleet.facts.docker.Networks", json.dumps({"names": ["dify_default", "x"]})),
             ("nemofleet.facts.host.CgroupVersion", "{}"),
             ("nemofleet.facts.docker.ContainerNetworks", json.dumps({"names": ["nemotron-0"]})))
    dockerd()
    cmd = Batch().command(parts=parts)
    assert cmd.count("import _socket") == 1
    sections = Batch().process(run(cmd, tmp_path))
    assert sorted(sections) == [ENGINE, 0, 1, 2]
    read = sections[ENGINE]
    assert Networks().process(engine.lines_for(Networks(), sections[0], read)) == {"dify_default": True, "x": False}
    assert ContainerNetworks().process(engine.lines_for(ContainerNetworks(), sections[2], read))["nemotron-0"]["running"]
    assert engine.lines_for(object(), sections[1], read) == sections[1]


def test_the_read_program_refuses_a_path_that_is_not_one_word(tmp_path):
    """remote/engine_read.py run as the hosts run it: a path with a space, CR or LF (which the
    controller never sends: `named` %-quotes) is refused there too; no socket means "down"."""
    from pathlib import Path
    from nemofleet import remote

    prog = Path(remote.__file__).parent / "engine_read.py"
    env = {"PATH": os.environ["PATH"], "DOCKER_HOST": f"unix://{tmp_path}/absent.sock"}
    r = subprocess.run([sys.executable, "-I", "-S", str(prog), "5", "a", "/info x", "b", "/x\r\nHost: y",
                        "c", "info", "d", "/info"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines() == ["@@engine down a the API path is not one word",
                                     "@@engine down b the API path is not one word",
                                     "@@engine down c the API path is not one word",
                                     "@@engine down d No such file or directory"]
    env["DOCKER_HOST"] = "tcp://10.0.0.1:2375"
    r = subprocess.run([sys.executable, "-I", "-S", str(prog), "5", "a", "/info"], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.stdout == "@@engine down a DOCKER_HOST=tcp://10.0.0.1:2375 is not a unix socket\n"
