#!/usr/bin/python3 -IS
"""nemofleet's health check of a host's vLLM instances (runs on the host, stdlib only).

    nemofleet-health [CONFIG]     (CONFIG: /etc/nemofleet/health.json unless given)

Installed as /usr/local/bin/nemofleet-health and run by cron under a lock (templates/
nemofleet-health.cron.j2), by the deploy once after a change, and by the rollout's gate. What it
checks comes from CONFIG, rendered by nemofleet from the host's plan (render.health_config): the
instances (name, port, served name, unit), the GPUs each runs on, the serving group, the paths.
Nothing of it is ever run as code: every command this program starts is an argument list.

Knobs (environment, as the healthcheck.sh of docs/recipes.md; a line KEY=value of the 0600 file
CONFIG["conf"], /etc/nemofleet/health.conf, sets one too, and wins): VLLM_URL, INTERVAL,
CHECK_MODELS, CHECK_INFER, MODEL_NAME; FAIL_RESTART (restart an instance after N consecutive
failures, 0 = off), RESTART_GRACE (no restart of an instance that has not been healthy since it
started, for that many seconds: it is still loading), RESTARTS_PER_HOUR (cap per instance),
WEBHOOK_URL (default: DEFAULT_WEBHOOK_URL of health.conf, 0600: the URL is often itself a
credential; it reaches curl on stdin, never on a command line), PROM_DIR, GPU_RETURN_AFTER.
Load figures of each instance are read from its /metrics (docs/monitoring.md lists every metric).
GPU watch (docs/gpu-health.md): one bounded nvidia-smi call per run for every GPU and the kernel
log's Xid lines; a GPU that turns sick takes its instance(s) out of the front door (requests in
flight finish), never restarted, one log line, the webhook once; it returns at the next deploy,
or after GPU_RETURN_AFTER healthy checks in a row (0, the default: only at a deploy).
Its files (config, conf, state, the textfile) are read and written by the prelude's rules (a link
or a FIFO is not read, a file is replaced by a temporary one and a rename) and its HTTP by the
prelude's rule as curl options (Health.curl). Exit 0 when every instance is healthy, 1 otherwise.
"""

import csv
import json
import os
import re
import socket
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

CONFIG = "/etc/nemofleet/health.json"
NA = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
ACTIONS = {"None": 0, "Reset": 1, "Reboot": 2, "Drain P2P": 3, "Drain and Reset": 4}
# a GPU UUID as nvidia-smi prints it (GPU-xxxxxxxx-...); anything else never names a state file
UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,80}")


class Health:
    def __init__(self, cfg, env):
        self.cfg = cfg
        self.knobs = dict(env)
        self.knobs.update(read_conf(cfg.get("conf") or ""))
        self.state = cfg["state_dir"]
        self.auth = cfg.get("auth_header") or ""
        self.drain = cfg.get("drain") or ""
        self.address = cfg["address"]
        self.group = cfg.get("group")
        self.instances = cfg["instances"]
        self.gpus = cfg.get("gpus", [])
        self.prom_dir = self.knob("PROM_DIR", cfg["prom_dir"])
        self.webhook = self.knob("WEBHOOK_URL", self.knob("DEFAULT_WEBHOOK_URL", ""))

    def knob(self, name, default):
        """A knob's value; empty counts as unset (as ${NAME:-default} did)."""
        value = self.knobs.get(name)
        return value if value else str(default)

    def number(self, name, default):
        try:
            return int(self.knob(name, default))
        except ValueError:
            return int(default)

    # ---------------------------------------------------------------- tools

    def run(self, argv, timeout, stdin=None, show=False):
        """(exit status, stdout) of a command; 127 when it cannot run, 124 when it timed out.
        show: its output goes to this program's own (the drain script's and systemctl's lines
        belong in the log, as they did), and "" is returned."""
        if show:
            sys.stdout.flush()
        try:
            r = subprocess.run(argv, input=stdin, stdout=None if show else subprocess.PIPE,
                               stderr=None if show else subprocess.PIPE, text=True, timeout=timeout,
                               errors="replace")
        except subprocess.TimeoutExpired:
            return 124, ""
        except OSError:
            return 127, ""
        return r.returncode, r.stdout or ""

    def curl(self, args, timeout, auth=False, stdin=None):
        """curl with the API key's header read from its 0600 file (-H @file: never on argv; a link
        or a FIFO there is not read). The prelude's HTTP rule, as curl's options: http(s) only, a
        bounded body, each call's whole time bounded (--max-time in args), and no redirect
        followed (no -L): an instance's answer is its own, and the key goes nowhere else."""
        head = ["-H", "@" + self.auth] if auth and self.auth and file_size(self.auth) is not None else []
        return self.run(["curl", "--proto", "=http,https", "--max-filesize", str(16 << 20), *head, *args],
                        timeout, stdin)

    def drain_script(self):
        return self.drain if self.drain and os.access(self.drain, os.X_OK) else None

    def state_file(self, name):
        return os.path.join(self.state, name)

    def read_state(self, name, default=""):
        data = read_file(self.state_file(name), 1 << 20)
        return default if data is None else data.decode("utf-8", "replace").strip()

    def has_state(self, name):
        return file_size(self.state_file(name)) is not None

    def write_state(self, name, text):
        write_file(self.state_file(name), text.encode())

    def int_state(self, name):
        try:
            return int(self.read_state(name, "0") or 0)
        except ValueError:
            return 0

    # ---------------------------------------------------------------- checks

    def base(self, port):
        return self.knob("VLLM_URL", "http://%s:%s" % (self.address, port))

    def check_worker(self, unit):
        """A headless member of a serving group: its unit, and the head's rendezvous port."""
        g = self.group or {}
        if self.run(["systemctl", "is-active", "-q", unit], 30)[0] != 0:
            return "headless worker of serving group %s: %s is not active" % (g.get("name"), unit)
        try:
            socket.create_connection((g["head"], int(g["port"])), timeout=5).close()
        except (OSError, ValueError, TypeError, KeyError):
            return "the head of serving group %s (%s:%s) does not answer: the group is down" % (
                g.get("name"), g.get("head"), g.get("port"))
        return None

    def check_one(self, name, port, model, unit):
        """None when healthy, else the reason."""
        if port == 0:
            return self.check_worker(unit)
        base, want = self.base(port), self.knob("MODEL_NAME", model)
        rc, code = self.curl(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", base + "/health"], 15)
        code = code.strip() if rc == 0 else "000"
        if code != "200":
            return "/health returned %s" % (code or "000")
        if self.knob("CHECK_MODELS", 1) == "1":
            rc, out = self.curl(["-fsS", "--max-time", "5", base + "/v1/models"], 15, auth=True)
            if rc != 0 or ('"id": "%s"' % want not in out and '"id":"%s"' % want not in out):
                return "/v1/models does not list %s" % want
        if self.knob("CHECK_INFER", self.cfg["check_infer"]) == "1":
            # enable_thinking false + enough max_tokens: reasoning cannot starve the answer (docs/recipes.md)
            body = json.dumps({"model": want, "messages": [{"role": "user", "content": "Reply with OK."}],
                               "max_tokens": 256, "temperature": 0,
                               "chat_template_kwargs": {"enable_thinking": False}}, separators=(",", ":"))
            rc, out = self.curl(["-fsS", "--max-time", "60", "-H", "Content-Type: application/json", "-d", body,
                                 base + "/v1/chat/completions"], 70, auth=True)
            if rc != 0 or not re.search(r'"content": *"[^"]', out):
                return "inference probe got no content"
        return None

    def load_of(self, port):
        """(running, waiting, kv) from the instance's /metrics ("-" for a figure it lacks), or None
        when /metrics cannot be read (the instance is down): no load lines, not zeros. Several
        engines (data parallel): requests are summed, the KV-cache ratio is their mean.
        vllm:gpu_cache_usage_perc is read only from a server older than v0.11, which lacks the new name."""
        rc, text = self.curl(["-fsS", "--max-time", "5", self.base(port) + "/metrics"], 15, auth=True)
        if rc != 0:
            return None
        sums = {"r": [0.0, 0], "w": [0.0, 0], "k": [0.0, 0], "g": [0.0, 0]}
        names = {"vllm:num_requests_running": "r", "vllm:num_requests_waiting": "w",
                 "vllm:kv_cache_usage_perc": "k", "vllm:gpu_cache_usage_perc": "g"}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            n = re.split(r"[{ \t]", line, 1)[0]
            if n not in names:
                continue
            rest = re.sub(r"^[^{ \t]*([{].*[}])?[ \t]+", "", line, 1)
            s = sums[names[n]]
            s[0] += awk_number(re.split(r"[ \t]+", rest)[0] if rest else "")
            s[1] += 1
        if not sums["k"][1] and sums["g"][1]:
            sums["k"] = sums["g"]
        if not (sums["r"][1] or sums["w"][1] or sums["k"][1]):
            return None
        return ("%.0f" % sums["r"][0] if sums["r"][1] else "-", "%.0f" % sums["w"][0] if sums["w"][1] else "-",
                "%.6g" % (sums["k"][0] / sums["k"][1]) if sums["k"][1] else "-")

    def started_at(self, unit):
        """Unix time the unit last became active (0 when unknown)."""
        rc, t = self.run(["systemctl", "show", "-p", "ActiveEnterTimestamp", "--value", unit], 30)
        t = t.strip()
        if not t:
            return 0
        rc, out = self.run(["date", "-d", t, "+%s"], 10)
        try:
            return int(out.strip()) if rc == 0 else 0
        except ValueError:
            return 0

    def maybe_restart(self, name, unit, fails, now):
        """Restart after FAIL_RESTART failures, outside the loading grace, within the hourly cap."""
        fail_restart = self.number("FAIL_RESTART", self.cfg["fail_restart"])
        if not (fail_restart > 0 and fails >= fail_restart):
            return
        started = self.started_at(unit)
        last = self.int_state(name + ".last_success")
        grace = self.number("RESTART_GRACE", self.cfg["restart_grace"])
        # a success in the very second the unit started is not proof it came up (one-second clocks): <=
        if last <= started and now - started < grace:
            print("instance %s: not restarting %s: not healthy yet since it started %ds ago (loading; grace %ds)"
                  % (name, unit, now - started, grace))
            return
        cap = self.number("RESTARTS_PER_HOUR", self.cfg["restarts_per_hour"])
        recent = 0
        for line in self.read_state(name + ".restarts").splitlines():
            try:
                recent += float(line.split()[0]) > now - 3600
            except (ValueError, IndexError):
                pass
        if recent >= cap:
            print("instance %s: not restarting %s: %d restarts in the last hour (cap %d); needs a person"
                  % (name, unit, recent, cap))
            return
        print("instance %s: restarting %s after %d consecutive failures" % (name, unit, fails))
        append_file(self.state_file(name + ".restarts"), b"%d\n" % now)
        # out of the front door first (its requests finish); back in once a later check passes it
        drain = self.drain_script()
        if drain:
            self.run([drain, "out", name], 600, show=True)
        self.run(["systemctl", "restart", unit], 600, show=True)
        self.write_state(name + ".fails", "0\n")

    def notify(self, name, state, reason):
        """The webhook: the URL goes to curl on stdin (-K -), never on its command line."""
        if not self.webhook:
            return
        why = reason.replace('"', "").replace("\\", "")
        body = json.dumps({"host": self.cfg["host"], "instance": name, "state": state, "reason": why},
                          separators=(",", ":"))
        rc, _ = self.curl(["-fsS", "--max-time", "5", "-K", "-", "-H", "Content-Type: application/json", "-d", body],
                          15, stdin='url = "%s"\n' % self.webhook)
        if rc != 0:
            print("instance %s: the webhook call failed" % name)

    # ---------------------------------------------------------------- GPUs

    def gpu_read(self):
        """(rows, error, metric lines, verdicts [(state, index, uuid, why)])."""
        fields = list(self.cfg["gpu_fields"])
        drain = [str(c) for c in self.cfg["drain_xids"]]
        # the fields this driver accepts (state gpu-fields), once one was refused
        fields = [f for f in self.read_state("gpu-fields").split(",") if f] or fields
        rows, error = [], None
        for _ in range(len(fields)):  # at most once per field; one call when the driver knows them all
            try:
                r = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=20)
            except subprocess.TimeoutExpired:
                error = "nvidia-smi did not answer within 20 s"
                break
            except OSError as exc:
                error = "nvidia-smi cannot run: %s" % exc
                break
            m = re.match(r'Field "(.+)" is not a valid field to query', r.stdout)
            if r.returncode == 2 and m and m.group(1) in fields:
                fields.remove(m.group(1))
                self.write_state("gpu-fields", ",".join(fields) + "\n")
                continue
            if r.returncode:
                error = "nvidia-smi exit %d: %s" % (r.returncode, " ".join(r.stdout.split())[:160])
            else:
                rows = [dict(zip(fields, (c.strip() for c in row)))
                        for row in csv.reader(r.stdout.splitlines(), skipinitialspace=True) if row]
            break
        # gpu-bus: index uuid bus of the last good read: Xids still find their GPU
        if rows:
            self.write_state("gpu-bus", "".join("%s %s %s\n" % (g.get("index"), g.get("uuid"), g.get("pci.bus_id"))
                                                for g in rows))
        else:
            rows = [dict(zip(("index", "uuid", "pci.bus_id"), ln.split()))
                    for ln in self.read_state("gpu-bus").splitlines() if len(ln.split()) == 3]
        btime = 0
        try:
            for ln in open("/proc/stat"):
                if ln.startswith("btime "):
                    btime = int(ln.split()[1])
        except (OSError, ValueError):
            pass
        resets = {}  # type: dict[str, int]
        for ln in (read_file(self.cfg["resets_file"], 1 << 20) or b"").decode("utf-8", "replace").splitlines():
            p = ln.split()
            if len(p) == 2 and p[1].isdigit():
                resets[bus_key(p[0])] = max(resets.get(bus_key(p[0]), 0), int(p[1]))
        log = ""
        for cmd in (["dmesg"], ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager"]):
            rc, out = self.run(cmd, 10)
            if rc == 0:
                log = out
                break
        xids = {}  # type: dict[str, list]
        for ln in [x for x in log.splitlines() if "NVRM: Xid" in x][-200:]:
            m = re.match(r"^\[\s*(\d+(?:\.\d+)?)\].*NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)", ln)
            if m:
                xids.setdefault(bus_key(m.group(2)), []).append((btime + float(m.group(1)), int(m.group(3))))
        metrics, verdicts = {}, []  # type: dict, list

        def metric(name, g, value, **extra):
            if value is not None:
                labels = 'gpu="%s",UUID="%s",pci_bus_id="%s"' % (
                    label(g.get("index")), label(g.get("uuid")), label(g.get("pci.bus_id")))
                labels += "".join(',%s="%s"' % (k, label(v)) for k, v in extra.items())
                metrics.setdefault(name, []).append("%s{%s} %s" % (name, labels, value))

        for g in rows:
            b = bus_key(g.get("pci.bus_id", ""))
            since = max(btime, resets[b] + 1 if b in resets else 0)  # btime is whole seconds: 1 s of slack after a reset
            counting = [c for t, c in xids.get(b, []) if t > since]
            lost = "[GPU is lost]" in g.values()
            bad = [c for c in counting if str(c) in drain]
            why = None
            action = g.get("gpu_recovery_action", "N/A")
            if lost:
                why = "nvidia-smi reports it lost ([GPU is lost])%s; reboot the host" % (
                    " after Xid %d" % bad[-1] if bad else "")
            elif action not in NA and action != "None":
                why = "its GPU Recovery Action is %s" % action
            elif g.get("remapped_rows.failure") == "Yes":
                why = "remapped_rows.failure is Yes; replace the GPU"
            elif g.get("remapped_rows.pending") == "Yes":
                why = "remapped_rows.pending is Yes; drain it, reset it (nvidia-smi -r -i %s), record the reset" % g.get("index")
            elif (num(g.get("ecc.errors.uncorrected.volatile.total")) or 0) > 0:
                why = "ecc.errors.uncorrected.volatile.total is %s; reset it (nvidia-smi -r -i %s)" % (
                    g["ecc.errors.uncorrected.volatile.total"], g.get("index"))
            elif g.get("retired_pages.pending") == "Yes":
                why = "retired_pages.pending is Yes; reset it (nvidia-smi -r -i %s)" % g.get("index")
            if not why and bad:
                why = "Xid %d in the kernel log since boot%s" % (bad[-1], "; reboot the host" if 79 in bad else
                                                                 "; reset it (nvidia-smi -r -i %s)" % g.get("index"))
            if not error or why:
                verdicts.append(("sick" if why else "ok", g.get("index"), g.get("uuid"), why or "healthy"))
            if error:
                continue
            metric("nemofleet_gpu_temperature_celsius", g, num(g.get("temperature.gpu")))
            metric("nemofleet_gpu_ecc_uncorrected_volatile_total", g, num(g.get("ecc.errors.uncorrected.volatile.total")))
            metric("nemofleet_gpu_ecc_uncorrected_aggregate_total", g, num(g.get("ecc.errors.uncorrected.aggregate.total")))
            metric("nemofleet_gpu_correctable_remapped_rows", g, num(g.get("remapped_rows.correctable")))
            metric("nemofleet_gpu_uncorrectable_remapped_rows", g, num(g.get("remapped_rows.uncorrectable")))
            metric("nemofleet_gpu_row_remap_pending", g, flag(g.get("remapped_rows.pending"), "Yes"))
            metric("nemofleet_gpu_row_remap_failure", g, flag(g.get("remapped_rows.failure"), "Yes"))
            metric("nemofleet_gpu_retired_pages_pending", g, flag(g.get("retired_pages.pending"), "Yes"))
            metric("nemofleet_gpu_recovery_action", g, ACTIONS.get(action, None if action in NA else 99))
            metric("nemofleet_gpu_pcie_link_gen", g, num(g.get("pcie.link.gen.current")))
            metric("nemofleet_gpu_pcie_link_gen_max", g, num(g.get("pcie.link.gen.max")))
            metric("nemofleet_gpu_pcie_link_width", g, num(g.get("pcie.link.width.current")))
            metric("nemofleet_gpu_pcie_link_width_max", g, num(g.get("pcie.link.width.max")))
            for reason in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"):
                metric("nemofleet_gpu_clocks_event_active", g, flag(g.get("clocks_event_reasons." + reason), "Active"),
                       reason=reason)
            metric("nemofleet_gpu_xid_last", g, counting[-1] if counting else 0)
            metric("nemofleet_gpu_xid_events_since_reset", g, len(counting))
            metric("nemofleet_gpu_healthy", g, 0 if why else 1)
        lines = []
        for name, ls in metrics.items():
            lines.append("# TYPE %s gauge" % name)
            lines += ls
        return error, lines, verdicts

    def gpu_watch(self, now):
        """Drains the instances of a GPU that turned sick; returns the GPU metric lines."""
        error, lines, verdicts = self.gpu_read()
        if error:
            print("GPU watch: %s" % error)
        for state, index, uuid, why in verdicts:
            if not isinstance(uuid, str) or not UUID.fullmatch(uuid):
                print("GPU watch: GPU %s has a UUID nemofleet does not know the shape of (%.80r): skipped" % (index, uuid))
                continue
            names = [g["instance"] for g in self.gpus if g.get("uuid") == uuid]
            shown = " ".join(names) or "none"
            mark = "gpu-%s.sick" % uuid
            if state == "sick":
                self.write_state("gpu-%s.healthy_runs" % uuid, "0\n")
                if self.has_state(mark):
                    continue
                self.write_state(mark, "%s %s %s %s\n" % (uuid, now, index, why))
                print("GPU %s (%s) is sick: %s; instance(s) %s out of the front door, not restarted"
                      % (index, uuid, why, shown))
                for n in names:
                    self.write_state(n + ".gpu_sick", "GPU %s: %s\n" % (index, why))
                    drain = self.drain_script()
                    if drain:
                        self.run([drain, "out", n], 600, show=True)
                    self.notify(n, "gpu_sick", "GPU %s (%s): %s" % (index, uuid, why))
            elif self.has_state(mark):
                runs = self.int_state("gpu-%s.healthy_runs" % uuid) + 1
                self.write_state("gpu-%s.healthy_runs" % uuid, "%d\n" % runs)
                back = self.number("GPU_RETURN_AFTER", 0)
                if back > 0 and runs >= back:
                    print("GPU %s (%s) healthy for %d checks in a row: instance(s) %s return" % (index, uuid, runs, shown))
                    for f in (mark, "gpu-%s.healthy_runs" % uuid):
                        remove_tree(self.state_file(f))
                    for n in names:
                        remove_tree(self.state_file(n + ".gpu_sick"))
        return lines

    # ---------------------------------------------------------------- one run

    def run_once(self):
        os.makedirs(self.state, exist_ok=True)
        os.makedirs(self.prom_dir, exist_ok=True)
        now = int(time.time())
        up_lines = ["# HELP nemofleet_vllm_up 1 when the instance passed its last health check.",
                    "# TYPE nemofleet_vllm_up gauge"]
        # the GPUs first: an instance whose GPU just turned sick is out of the front door before its check
        gpu_lines = self.gpu_watch(now)
        lines, unhealthy = [], 0
        for inst in self.instances:
            name, port, model, unit = inst["name"], int(inst["port"]), inst["model"], inst["unit"]
            t0 = time.monotonic()
            reason = self.check_one(name, port, model, unit)
            up = 0 if reason else 1
            lat = "%.3f" % (time.monotonic() - t0)
            prev = self.read_state(name + ".state", "unknown") or "unknown"
            sick = self.has_state(name + ".gpu_sick")
            if sick:
                # on a sick GPU: stays out of the front door, never restarted; the GPU's webhook call was the one
                unhealthy, up = 1, 0
                reason = "drained: %s" % self.read_state(name + ".gpu_sick")
                print("instance %s %s" % (name, reason))
            elif up:
                self.write_state(name + ".last_success", "%d\n" % now)
                self.write_state(name + ".fails", "0\n")
                print("instance %s healthy (%ss)" % (name, lat))
                # healthy but drained in the front door (after a self-heal, a failed deploy or a rollback): back in
                drain = self.drain_script()
                if drain and self.run([drain, "state", name], 60)[1].strip() == "drain":
                    self.run([drain, "in", name], 600, show=True)
            else:
                unhealthy = 1
                fails = self.int_state(name + ".fails") + 1
                self.write_state(name + ".fails", "%d\n" % fails)
                print("instance %s UNHEALTHY: %s (failure %d)" % (name, reason, fails))
                # a worker's restart cannot bring a lost head back (systemd restarts a dead worker itself)
                if port != 0:
                    self.maybe_restart(name, unit, fails, now)
            st = "gpu_sick" if sick else ("up" if up else "down")
            self.write_state(name + ".state", st + "\n")
            if prev != st and prev != "unknown" and st != "gpu_sick":
                self.notify(name, st, reason or "")
            last = self.int_state(name + ".last_success")
            restarts = len(self.read_state(name + ".restarts").splitlines())
            n = label(name)
            up_lines.append('nemofleet_vllm_up{instance="%s",model="%s",port="%d"} %d' % (n, label(model), port, up))
            lines.append('nemofleet_vllm_last_success_timestamp_seconds{instance="%s"} %d' % (n, last))
            lines.append('nemofleet_vllm_check_latency_seconds{instance="%s"} %s' % (n, lat))
            lines.append('nemofleet_vllm_self_heal_restarts_total{instance="%s"} %d' % (n, restarts))
            if self.group:
                g = self.group
                lines.append('nemofleet_serving_group_member_up{group="%s",role="%s",rank="%s",instance="%s"} %d' % (
                    label(g["name"]), label(g["role"]), label(g["rank"]), n, up))
            load = self.load_of(port) if port != 0 else None
            for full, value in zip(("nemofleet_vllm_num_requests_running", "nemofleet_vllm_num_requests_waiting",
                                    "nemofleet_vllm_kv_cache_usage_ratio"), load or ()):
                if value != "-":
                    lines.append('%s{instance="%s"} %s' % (full, n, value))
        out = list(up_lines)
        for name, text in (
                ("nemofleet_vllm_last_success_timestamp_seconds", "Unix time of the last passed check."),
                ("nemofleet_vllm_check_latency_seconds", "Duration of the last check."),
                ("nemofleet_vllm_self_heal_restarts_total", "Restarts made by the health check."),
                ("nemofleet_vllm_num_requests_running",
                 "Requests in the instance's running batches (vllm:num_requests_running)."),
                ("nemofleet_vllm_num_requests_waiting", "Requests queued at the instance (vllm:num_requests_waiting)."),
                ("nemofleet_vllm_kv_cache_usage_ratio",
                 "KV-cache usage of the instance, 0 to 1 (vllm:kv_cache_usage_perc)."),
                ("nemofleet_serving_group_member_up",
                 "1 when this member of a multi-node serving group is up (the head: the whole group answers).")):
            if name == "nemofleet_serving_group_member_up" and not self.group:
                continue
            out.append("# HELP %s %s" % (name, text))
            out.append("# TYPE %s %s" % (name, "counter" if name.endswith("_total") else "gauge"))
            out += [ln for ln in lines if ln.startswith(name + "{")]
        # per GPU (docs/monitoring.md): the fields of the one nvidia-smi call, Xids, and the verdict
        out += gpu_lines
        out += ["# HELP nemofleet_health_last_run_timestamp_seconds Unix time of the last health run.",
                "# TYPE nemofleet_health_last_run_timestamp_seconds gauge",
                "nemofleet_health_last_run_timestamp_seconds %d" % now]
        # nemofleet.prom.tmp, then a rename: the textfile collector reads only *.prom, and never half of it
        write_file(os.path.join(self.prom_dir, "nemofleet.prom"), "".join(ln + "\n" for ln in out).encode())
        sys.stdout.flush()
        return unhealthy


def read_conf(path):
    """KEY=value lines of the 0600 conf file (a value in single quotes, as older files wrote it, unquoted)."""
    out = {}
    for line in (read_file(path, 1 << 20) or b"").decode("utf-8", "replace").splitlines():
        key, eq, value = line.strip().partition("=")
        if not eq or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            continue
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("'\\''", "'")
        out[key] = value
    return out


def bus_key(bus):
    p = bus.strip().lower().split(".")[0].split(":")
    return "%s:%s:%s" % (p[-3][-4:], p[-2], p[-1]) if len(p) >= 3 else bus.lower()


def num(v):
    return None if v in NA or not re.fullmatch(r"\d+", v or "") else int(v)


def flag(v, yes):
    return None if v in NA else int(v == yes)


def label(v):
    """A Prometheus label value: backslash, quote and newline escaped (the text format's rules)."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def awk_number(s):
    """The number awk reads from the start of s (0 when none), as `v + 0` did."""
    m = re.match(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", s.strip())
    return float(m.group(0)) if m else 0.0


def main(argv):
    path = argv[0] if argv else CONFIG
    cfg = read_json(path, 1 << 20)
    if not isinstance(cfg, dict):
        print("nemofleet-health: cannot read its config %s (%s); run the nemofleet deploy again"
              % (path, "not a JSON object in a regular file" if os.path.lexists(path) else "there is none"))
        return 1
    health = Health(cfg, os.environ)
    interval = health.number("INTERVAL", 0)
    if interval > 0:
        while True:
            health.run_once()
            time.sleep(interval)
    return health.run_once()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
