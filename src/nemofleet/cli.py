"""nemofleet command line: testbed, plan, status, models.

    nemofleet testbed up|down|status|recreate HOST
    nemofleet plan INVENTORY [--limit HOST] [--json] [--facts FILE]
    nemofleet status INVENTORY [--limit HOST]
    nemofleet models
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def _pyinfra(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    env = dict(os.environ, PYINFRA_PROGRESS="off")
    return subprocess.run([exe, *args], capture_output=capture, text=True, env=env)


def gather_facts(inventory: str, limit: list[str]) -> dict:
    """HostFacts of every host, read-only (pyinfra's `fact` command)."""
    args = [inventory, "--json"]
    for h in limit:
        args += ["--limit", h]
    r = _pyinfra(*args, "fact", "nemofleet.facts.host.HostFacts")
    out = r.stdout
    try:
        data = json.loads(out[out.index("{"):out.rindex("}") + 1])
        return data.get("nemofleet.facts.host.HostFacts", data)
    except ValueError:
        sys.exit(f"could not read facts from {inventory}:\n{r.stderr[-2000:]}")


def host_data(inventory: str, limit: list[str]) -> dict:
    """Merged host data per host (pyinfra debug-inventory --json)."""
    from pyinfra.api import Config, State
    from pyinfra.api.host import extract_callable_datas
    from pyinfra_cli.inventory import make_inventory

    from pyinfra.context import ctx_state

    state = State(check_for_changes=False)
    with ctx_state.use(state):
        inv = make_inventory(inventory, cwd=os.getcwd())
    state.init(inv, Config())
    out = {}
    for h in inv:
        if limit and h.name not in limit:
            continue
        d: dict = {}
        for layer in reversed(list(extract_callable_datas(h.data.datas))):
            d.update(layer)
        out[h.name] = d
    return out


def cmd_plan(a) -> int:
    from . import preflight as checks

    facts = json.load(open(a.facts)) if a.facts else gather_facts(a.inventory, a.limit)
    datas = host_data(a.inventory, a.limit)
    result, rc = {}, 0
    for name, data in datas.items():
        f = facts.get(name)
        if f is None:
            result[name] = {"refused": ["no facts (host unreachable?)"]}
            rc = 1
            continue
        v = checks.check(name, f, data)
        if v.refusals:
            rc = 1
        result[name] = {"refused": v.refusals, "warnings": v.warnings,
                        "plan": v.plan.to_dict() if v.plan else None}
    if a.json:
        print(json.dumps(result, indent=2))
        return rc
    for name, r in result.items():
        print(f"== {name}")
        for s in r["refused"]:
            print(f"   REFUSED: {s}")
        for w in r.get("warnings", []):
            print(f"   warning: {w}")
        p = r.get("plan")
        if not p or r["refused"]:
            continue
        print(f"   {p['model']} ({p['repo']}@{p['revision'][:12]}) on {p['image']}, GPUs via {p['gpu_method']}")
        print(f"   {'instance':<14}{'GPUs':<10}{'port':<6}{'TP':<4}{'EP':<4}{'context':<9}{'seqs':<6}{'memory GiB (need/avail)'}")
        for i in p["instances"]:
            print(f"   {i['name']:<14}{','.join(map(str, i['gpus'])):<10}{i['port']:<6}{i['tp']:<4}{'y' if i['ep'] else '-':<4}"
                  f"{i['max_model_len']:<9}{i['max_num_seqs']:<6}{i['memory_need_bytes'] / 2**30:.1f}/{i['memory_available_bytes'] / 2**30:.1f}")
        print("   flags: " + " ".join(p["instances"][0]["args"][1:]))
    return rc


STATUS_CMD = r"""
cat /var/lib/nemofleet/release 2>/dev/null | sed 's/^/release /'
for u in /etc/systemd/system/nemofleet-vllm-*.service; do [ -e "$u" ] || continue; n=$(basename $u);
  echo "unit $n $(systemctl is-active $n)"; done
cat /var/lib/prometheus/node-exporter/nemofleet.prom 2>/dev/null | grep -v '^#' | sed 's/^/prom /'
"""


def cmd_status(a) -> int:
    args = [a.inventory, "--json"]
    for h in a.limit:
        args += ["--limit", h]
    r = _pyinfra(*args, "exec", "--", STATUS_CMD)
    print(r.stdout if r.returncode == 0 else r.stdout + r.stderr)
    return r.returncode


def cmd_models(a) -> int:
    from .models import CATALOG

    for m in CATALOG.values():
        print(f"{m.key:<34} {m.repo:<58} {m.precision:<6} {m.weight_bytes / 1e9:6.1f} GB  "
              f"reasoning={m.reasoning_parser or '-'} spec={','.join(m.speculative) or '-'}")
    return 0


def cmd_testbed(a) -> int:
    from . import testbed

    if a.action == "up":
        testbed.up(a.profile, a.hosts or None)
    elif a.action == "down":
        testbed.down()
    elif a.action == "status":
        for row in testbed.status():
            print(f"{row['host']:<12} 127.0.0.1:{row['port']:<6} {row['gpus']} GPU(s)  {row['group']:<10} {row['container']}")
    elif a.action == "recreate":
        for h in a.hosts:
            testbed.recreate(h)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="nemofleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("testbed", help="the local testbed of simulated GPU hosts")
    t.add_argument("action", choices=["up", "down", "status", "recreate"])
    t.add_argument("hosts", nargs="*")
    t.add_argument("--profile", default="default")
    t.set_defaults(fn=cmd_testbed)
    p = sub.add_parser("plan", help="print the serving plan per host (read-only)")
    p.add_argument("inventory")
    p.add_argument("--limit", action="append", default=[])
    p.add_argument("--json", action="store_true")
    p.add_argument("--facts", help="facts JSON ({host: HostFacts}) instead of reading the hosts")
    p.set_defaults(fn=cmd_plan)
    s = sub.add_parser("status", help="release, units and health per host")
    s.add_argument("inventory")
    s.add_argument("--limit", action="append", default=[])
    s.set_defaults(fn=cmd_status)
    m = sub.add_parser("models", help="the model catalog")
    m.set_defaults(fn=cmd_models)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
