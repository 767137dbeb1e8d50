"""Docker engine and daemon.json facts."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

ABSENT = "##NEMOFLEET_ABSENT##"


class DockerInfo(FactBase):
    """{"installed", "running", "server", "cgroup_driver", "cgroup_version", "default_runtime", "runtimes"}."""

    def command(self) -> str:
        fmt = ("server={{.ServerVersion}}\ncgroup_driver={{.CgroupDriver}}\n"
               "cgroup_version={{.CgroupVersion}}\ndefault_runtime={{.DefaultRuntime}}\n"
               "runtimes={{json .Runtimes}}")
        return ("command -v docker >/dev/null 2>&1 || { echo installed=0; exit 0; }; echo installed=1; "
                f"docker info --format {shlex.quote(fmt)} 2>/dev/null || echo running=0")

    def default(self):
        return {"installed": False, "running": False, "server": None, "cgroup_driver": None,
                "cgroup_version": None, "default_runtime": None, "runtimes": []}

    def process(self, output):
        out = self.default()
        out["running"] = True
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "installed":
                out["installed"] = value == "1"
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
        return (f"docker image inspect --format '{{{{.Id}}}} {{{{json .Config.Env}}}}' {shlex.quote(ref)} "
                "2>/dev/null || echo absent")

    def process(self, output):
        lines = [x.strip() for x in output if x.strip()]
        line = lines[0] if lines else "absent"
        if line == "absent":
            return None
        img_id, _, env = line.partition(" ")
        try:
            env_list = json.loads(env) or []
        except ValueError:
            env_list = []
        return {"id": img_id, "env": dict(e.split("=", 1) for e in env_list if "=" in e)}
