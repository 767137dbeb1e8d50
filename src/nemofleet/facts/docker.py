"""Docker engine and daemon.json facts."""

from __future__ import annotations

from . import Fact

from .. import shell
from . import engine
from .engine import EngineFact
from .gpu import Unreadable
from ..dockerconf import host_file_problem
from ..valuetypes import host_json, host_number, shown

ABSENT = "##NEMOFLEET_ABSENT##"


class DockerInfo(EngineFact, part="docker"):
    """{"installed", "running", "server", "cgroup_driver", "cgroup_version", "default_runtime", "runtimes"}:
    GET /info, what `docker info` shows."""

    FIELDS = {"server": "ServerVersion", "cgroup_driver": "CgroupDriver", "cgroup_version": "CgroupVersion",
              "default_runtime": "DefaultRuntime", "runtimes": "Runtimes"}

    def prefix(self) -> str:
        return "if command -v docker >/dev/null 2>&1; then echo installed=1; else echo installed=0; fi"

    def command(self) -> str:
        return self.read()

    def requests(self):
        return [engine.request("info", "/info")]

    def parse(self, output):
        out = self.default()
        out["installed"] = "installed=1" in [x.strip() for x in output]
        if not out["installed"]:
            return out  # no docker CLI: nothing else to read (the engine, if any, is not one nemofleet can drive)
        try:
            status, body = engine.answers(output).get("info") or ("down", None)  # "down": the read has no answer to it
        except Unreadable as exc:
            raise Unreadable(str(exc), out) from None
        if status == "timeout":
            raise Unreadable(f"docker info did not answer within {engine.ENGINE_TIMEOUT} s (dockerd hung?): "
                             "check `systemctl status docker` on the host", out)
        if status != 200 or not isinstance(body, dict):
            return out  # dockerd is not running (no socket, refused) or not answering as an engine
        got = {k: body.get(field) for k, field in self.FIELDS.items()}
        out["running"] = isinstance(got["server"], str) and bool(got["server"])
        for k in ("server", "cgroup_driver", "default_runtime"):
            out[k] = got[k] if isinstance(got[k], str) and got[k] else None
        # "1" or "2" (docker 20.10+); absent on an older engine
        version = got["cgroup_version"]
        out["cgroup_version"] = host_number(str(version) if isinstance(version, (str, int)) else None, 1, 2)
        out["runtimes"] = sorted(k for k in got["runtimes"] or {} if isinstance(k, str)) \
            if isinstance(got["runtimes"], dict) else []
        return out


class DaemonJson(Fact, part="daemon_json", reads={"path": "/etc/docker/daemon.json"}):
    """/etc/docker/daemon.json: {"exists", "text", "data", "error"}. `data` is its JSON object, {}
    when there is no file, and None when nemofleet must leave the file as it is (`error` says why:
    not a regular file, not JSON as dockerd reads it, a key nemofleet merges of another type)."""

    # the first line says what is at the path; the file's own lines, if any, come after it, so no
    # text in the file can pass for "no file" (and be overwritten)
    FILE, NOT_A_FILE = "##NEMOFLEET_FILE##", "##NEMOFLEET_NOT_A_FILE##"

    def command(self, path: str = "/etc/docker/daemon.json") -> str:
        q = shell.quote(path)
        # `; echo`: a file without a final newline (json.dump, echo -n) must not run into the
        # next part of HostFacts' one combined command
        return (f"if [ -f {q} ]; then echo '{self.FILE}'; cat {q}; echo; "
                f"elif [ -e {q} ] || [ -L {q} ]; then echo '{self.NOT_A_FILE}'; else echo '{ABSENT}'; fi")

    def parse(self, output):
        head, text = output[0].strip(), "\n".join(output[1:])
        if head == ABSENT:
            return {"exists": False, "text": "", "data": {}, "error": None}
        if head == self.NOT_A_FILE:
            return {"exists": True, "text": "", "data": None, "error": "not a regular file (a directory, or a link to nothing)"}
        if head != self.FILE:
            raise Unreadable(f"the daemon.json check printed {shown(head)} where it says what is at the path; "
                             "run `pyinfra HOST fact nemofleet.facts.docker.DaemonJson` to see it")
        try:
            data = host_json(text)
        except ValueError as exc:
            return {"exists": True, "text": text, "data": None, "error": f"not valid JSON as dockerd reads it ({exc})"}
        why = "has a top level that is not an object" if not isinstance(data, dict) else host_file_problem(data)
        return {"exists": True, "text": text, "data": None if why else data, "error": f"a file that {why}" if why else None}


class ImageInfo(EngineFact, part="image", reads={"ref": "image"}):
    """{"id", "env"} of a local image, or None when it is not on the host: GET /images/{ref}/json,
    what `docker image inspect` shows."""

    def command(self, ref: str) -> str:
        return self.read(ref=ref)

    def requests(self, ref: str):
        return [engine.request(engine.key("image", ref), engine.named("images", ref, "/json"))]

    def parse(self, output):
        """process(): None (absent) on a timeout too: the image op then pulls, itself bounded."""
        keys = engine.keyed(output, "image")
        if not keys:
            return None
        _, status, body = keys[0]
        if status == "timeout":
            raise Unreadable(f"docker image inspect did not answer within {engine.ENGINE_TIMEOUT} s (dockerd hung?)")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("Id"), str):
            return None  # 404: not on the host; dockerd not running: not there as far as docker can tell
        config = body.get("Config")
        env = config.get("Env") if isinstance(config, dict) else None
        env_list = [e for e in env if isinstance(e, str)] if isinstance(env, list) else []
        return {"id": body["Id"], "env": dict(e.split("=", 1) for e in env_list if "=" in e)}


class HostAddresses(Fact, part="addresses"):
    """{interface: [IP address, ...]} of the host (`ip -o addr`). docker0's first IPv4 address is
    Docker's default bridge gateway: what `host-gateway` (`--add-host=host.docker.internal:host-gateway`)
    resolves to in containers."""

    def command(self) -> str:
        return "ip -o addr show 2>/dev/null | awk '{print $2, $4}'"

    def parse(self, output):
        out: dict = {}
        for line in output:
            parts = line.split()
            if len(parts) == 2:
                out.setdefault(parts[0], []).append(parts[1].split("/", 1)[0])
        return out


class Networks(EngineFact):
    """{name: exists} for each Docker network name: GET /networks/{name} (`docker network inspect`),
    a network that answers under its own name (the API also answers an ID or an ID prefix)."""

    def command(self, names: tuple[str, ...]) -> str:
        return self.read(names=names)

    def requests(self, names: tuple[str, ...]):
        return [engine.request(engine.key("network", n), engine.named("networks", n)) for n in names]

    empty: dict = {}

    def parse(self, output):
        out = {}
        for name, status, body in engine.keyed(output, "network"):
            out[name] = status == 200 and isinstance(body, dict) and body.get("Name") == name
        return out


class ContainerNetworks(EngineFact):
    """{container: {"running": bool, "networks": {net: [aliases]}}} (stopped containers too), None
    for a container that is not there: GET /containers/{name}/json (`docker inspect`)."""

    def command(self, names: tuple[str, ...]) -> str:
        return self.read(names=names)

    def requests(self, names: tuple[str, ...]):
        return [engine.request(engine.key("container", n), engine.named("containers", n, "/json")) for n in names]

    empty: dict = {}

    def parse(self, output):
        out: dict[str, dict | None] = {}
        for name, status, body in engine.keyed(output, "container"):
            if status != 200 or not isinstance(body, dict) or body.get("Name") != f"/{name}":
                out[name] = None  # not there (404), or the engine could not tell
                continue
            state, settings = body.get("State"), body.get("NetworkSettings")
            nets = settings.get("Networks") if isinstance(settings, dict) else None
            nets = nets if isinstance(nets, dict) else {}
            out[name] = {"running": isinstance(state, dict) and state.get("Running") is True,
                         "networks": {k: _aliases(v) for k, v in nets.items() if isinstance(k, str)}}
        return out


def _aliases(endpoint) -> list[str]:
    aliases = endpoint.get("Aliases") if isinstance(endpoint, dict) else None
    return [a for a in aliases if isinstance(a, str)] if isinstance(aliases, list) else []
