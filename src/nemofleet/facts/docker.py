"""Docker engine and daemon.json facts."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from .gpu import TIMED_OUT, StrictFact, Unreadable

ABSENT = "##NEMOFLEET_ABSENT##"
# `docker info` / `docker image inspect` answer in well under a second from a live dockerd;
# 20 s means dockerd is hung (a stuck storage driver, a full disk): the host is refused, the run
# goes on for the others.
FACT_TIMEOUT = 20


class DockerInfo(StrictFact):
    """{"installed", "running", "server", "cgroup_driver", "cgroup_version", "default_runtime", "runtimes"}."""

    def command(self) -> str:
        fmt = ("server={{.ServerVersion}}\ncgroup_driver={{.CgroupDriver}}\n"
               "cgroup_version={{.CgroupVersion}}\ndefault_runtime={{.DefaultRuntime}}\n"
               "runtimes={{json .Runtimes}}")
        return ("command -v docker >/dev/null 2>&1 || { echo installed=0; exit 0; }; echo installed=1; "
                f"out=$(timeout {FACT_TIMEOUT} docker info --format {shlex.quote(fmt)} 2>/dev/null); rc=$?; "
                f"if [ $rc -eq {TIMED_OUT} ]; then echo timeout=1; elif [ $rc -ne 0 ]; then echo running=0; "
                "else printf '%s\\n' \"$out\"; fi")

    def default(self):
        return {"installed": False, "running": False, "server": None, "cgroup_driver": None,
                "cgroup_version": None, "default_runtime": None, "runtimes": []}


    def parse(self, output):
        out = self.default()
        out["running"] = True
        timed_out = False
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "installed":
                out["installed"] = value == "1"
            elif key == "timeout":
                timed_out = True
            elif key == "running":
                out["running"] = False
            elif key == "runtimes":
                try:
                    out["runtimes"] = sorted(json.loads(value or "{}"))
                except ValueError:
                    out["runtimes"] = []
            elif key == "cgroup_version":
                out[key] = int(value) if value.isdigit() else None
            elif key in out:
                out[key] = value or None
        if not out["installed"] or out["server"] is None:
            out["running"] = False
        if timed_out:
            raise Unreadable(f"docker info did not answer within {FACT_TIMEOUT} s (dockerd hung?): "
                             "check `systemctl status docker` on the host", out)
        return out


class DaemonJson(FactBase):
    """/etc/docker/daemon.json: {"exists", "text", "data", "error"}; `data` is None when malformed."""

    def command(self, path: str = "/etc/docker/daemon.json") -> str:
        q = shlex.quote(path)
        # `; echo`: a file without a final newline (json.dump, echo -n) must not run into the
        # next part of HostFacts' one combined command
        return f"if [ -f {q} ]; then cat {q}; echo; else echo '{ABSENT}'; fi"

    def default(self):
        return {"exists": True, "text": "", "data": None, "error": "daemon.json is empty"}

    def process(self, output):
        text = "\n".join(output)
        if text.strip() == ABSENT:
            return {"exists": False, "text": "", "data": {}, "error": None}
        try:
            data = json.loads(text)
        except ValueError as exc:
            return {"exists": True, "text": text, "data": None, "error": f"not valid JSON ({exc})"}
        if not isinstance(data, dict):
            return {"exists": True, "text": text, "data": None, "error": "the top level is not an object"}
        return {"exists": True, "text": text, "data": data, "error": None}


class ImageInfo(FactBase):
    """{"id", "env"} of a local image, or None when it is not on the host."""

    def command(self, ref: str) -> str:
        return (f"timeout {FACT_TIMEOUT} docker image inspect --format '{{{{.Id}}}} {{{{json .Config.Env}}}}' "
                f"{shlex.quote(ref)} 2>/dev/null; rc=$?; [ $rc -eq {TIMED_OUT} ] && echo timeout; "
                "[ $rc -eq 0 ] || echo absent")

    def process(self, output):
        """None (absent) on a timeout too: the image op then pulls, itself bounded."""
        try:
            return self.parse(output)
        except Unreadable as exc:
            return exc.value

    def parse(self, output):
        lines = [x.strip() for x in output if x.strip()]
        if "timeout" in lines:
            raise Unreadable(f"docker image inspect did not answer within {FACT_TIMEOUT} s (dockerd hung?)")
        line = lines[0] if lines else "absent"
        if line == "absent":
            return None
        img_id, _, env = line.partition(" ")
        try:
            env_list = json.loads(env) or []
        except ValueError:
            env_list = []
        return {"id": img_id, "env": dict(e.split("=", 1) for e in env_list if "=" in e)}


class HostAddresses(FactBase):
    """{interface: [IP address, ...]} of the host (`ip -o addr`). docker0's first IPv4 address is
    Docker's default bridge gateway: what `host-gateway` (`--add-host=host.docker.internal:host-gateway`)
    resolves to in containers."""

    command = "ip -o addr show 2>/dev/null | awk '{print $2, $4}'"

    def default(self):
        return {}

    def process(self, output):
        out: dict = {}
        for line in output:
            parts = line.split()
            if len(parts) == 2:
                out.setdefault(parts[0], []).append(parts[1].split("/", 1)[0])
        return out


class Networks(FactBase):
    """{name: exists} for each Docker network name."""

    def command(self, names: tuple[str, ...]) -> str:
        q = " ".join(shlex.quote(n) for n in names)
        # one docker call for every name (it prints the ones that exist), then one line per name
        return (f"found=$(timeout {FACT_TIMEOUT} docker network inspect --format '{{{{.Name}}}}' {q} 2>/dev/null); "
                f"for n in {q}; do if printf '%s\\n' \"$found\" | grep -qxF -- \"$n\"; then echo \"$n 1\"; "
                "else echo \"$n 0\"; fi; done")

    def process(self, output):
        return {line.split()[0]: line.split()[1] == "1" for line in output if line.strip()}


class ContainerNetworks(FactBase):
    """{container: {"running": bool, "networks": {net: [aliases]}}} (stopped containers too)."""

    def command(self, names: tuple[str, ...]) -> str:
        q = " ".join(shlex.quote(n) for n in names)
        fmt = "{{.Name}} {{.State.Running}} {{json .NetworkSettings.Networks}}"
        # one docker call for every container (it prints the ones that exist), then the absent ones
        return (f"out=$(timeout {FACT_TIMEOUT} docker inspect --type container -f '{fmt}' {q} 2>/dev/null); "
                "printf '%s\\n' \"$out\"; "
                f"for c in {q}; do printf '%s\\n' \"$out\" | cut -d' ' -f1 | grep -qxF -- \"/$c\" || echo \"/$c absent\"; done")

    def process(self, output):
        out = {}
        for line in output:
            parts = line.strip().split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("/"):
                continue  # a container being re-created can print a partial answer
            name, running, *rest = parts
            name = name.lstrip("/")
            if running == "absent":
                out[name] = None
                continue
            try:
                nets = json.loads(rest[0]) if rest else {}
            except ValueError:
                nets = {}
            out[name] = {"running": running == "true",
                         "networks": {k: (v or {}).get("Aliases") or [] for k, v in (nets or {}).items()}}
        return out
