"""nemofleet command line: testbed, plan, status, models.

    nemofleet testbed up|down|status|recreate HOST
    nemofleet plan INVENTORY [--limit HOST] [--json] [--facts FILE]
    nemofleet status INVENTORY [--limit HOST]
    nemofleet models
    nemofleet settings [--markdown]
    nemofleet rollout INVENTORY [--batch N|P%] [--canary N] [--max-failures N] [--wait S] [--limit H] [--data k=v]
    nemofleet rollback INVENTORY [--limit H]
    nemofleet lock status|acquire|release INVENTORY [--limit H] [--message M]
    nemofleet rebuild INVENTORY HOST [--accept-new-host-key]
"""
from __future__ import annotations

import argparse
import json
import re
import os
import sys
import time


def gather_facts(inventory: str, limit: list[str]) -> dict:
    """HostFacts of every host, read-only (pyinfra's `fact` command)."""
    from .rollout import pyinfra

    r = pyinfra(inventory, limit, "--json", "fact", "nemofleet.facts.host.HostFacts")
    out = r.stdout
    try:
        data = json.loads(out[out.index("{"):out.rindex("}") + 1])
        return data.get("nemofleet.facts.host.HostFacts", data)
    except ValueError:
        sys.exit(f"could not read facts from {inventory}:\n{r.stderr[-2000:]}")


def host_data(inventory: str, limit: list[str]) -> dict:
    from .rollout import host_data as read

    return read(inventory, limit)


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
        from .plantext import lines  # columns sized to their content (8-GPU instances, long names)

        for line in lines(p):
            print(f"   {line}")
    return rc


def status_script(models_root: str, prom_dir: str) -> str:
    """What `nemofleet status` reads on a host, with that host's own paths (settings)."""
    from shlex import quote

    from . import paths

    return rf"""
cat {paths.RELEASE} 2>/dev/null | sed 's/^/release /'
for u in {paths.UNIT_GLOB}; do [ -e "$u" ] || continue; n=$(basename $u);
  echo "unit $n $(systemctl is-active $n)"; done
cat {quote(prom_dir)}/nemofleet.prom 2>/dev/null | grep -v '^#' | sed 's/^/prom /'
for d in {quote(models_root)}/*/; do [ -d "$d" ] || continue; n=$(basename $d);
  total=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['metadata']['total_size'])" $d/model.safetensors.index.json 2>/dev/null || echo '?');
  echo "weights $n $(du -sb --exclude=.cache $d | cut -f1) of $total bytes, $([ -f $d/{paths.WEIGHTS_MARKER} ] && echo complete || echo incomplete)"; done
for u in $(systemctl list-units --no-legend --plain 'nemofleet-weights-*' 2>/dev/null | awk '{{print $1}}'); do
  echo "download $u $(systemctl is-active $u): $(journalctl -u $u -n 1 --no-pager -o cat 2>/dev/null | tr '\r' '\n' | tail -1)"; done
"""


def cmd_status(a) -> int:
    """Per host: release (and drift from the inventory's plan), units, health, weights, downloads."""
    from concurrent.futures import ThreadPoolExecutor

    from . import desired, rollout, settings

    try:
        hosts = rollout.inventory_hosts(a.inventory, a.limit)
    except ValueError as exc:
        print(f"status: {exc}", file=sys.stderr)
        return 2
    facts = gather_facts(a.inventory, a.limit)
    datas = host_data(a.inventory, a.limit)

    def script(h):
        d = {k: datas.get(h, {}).get(k) for k in ("models_root", "prom_dir")}
        return status_script(d["models_root"] or settings.BY_NAME["models_root"].default,
                             d["prom_dir"] or settings.BY_NAME["prom_dir"].default)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        answers = dict(zip(hosts, pool.map(lambda h: rollout.on_host(a.inventory, h, script(h)), hosts)))
    rc = 0
    for h in hosts:
        code, text = answers[h]
        print(f"== {h}")
        if code == 255:
            print("   unreachable")
            rc = 1
            continue
        lines = text.splitlines()
        have = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("release id=")), None)
        want, planned = None, {}
        if h in facts and h in datas:
            v = desired.build(h, datas[h], dict(facts[h], lock=None), {"vllm_api_key": "x" * 16})  # secrets are not in a release
            if v.ok:
                want = v.release_id
                planned = {i.name: (",".join(str(g.index) for g in i.gpus), v.plan.served_name) for i in v.plan.instances}
        drift = "in sync" if have and have == want else f"DRIFT: inventory plans {want or '(refused)'}"
        print(f"   release {have or 'none'} ({drift})")
        ups = {m.group(1): m.group(2) for m in (re.match(r'prom nemofleet_vllm_up\{instance="([^"]+)".*\} (\d)', ln) for ln in lines) if m}
        last = {m.group(1): int(m.group(2)) for m in (re.match(r'prom nemofleet_vllm_last_success_timestamp_seconds\{instance="([^"]+)"\} (\d+)', ln) for ln in lines) if m}
        for ln in lines:
            if ln.startswith("unit "):
                _, unit, state = ln.split()[:3]
                name = unit[len("nemofleet-vllm-"):-len(".service")]
                age = f"{time.time() - last[name]:.0f}s ago" if last.get(name) else "never"
                health = {"1": "healthy", "0": "UNHEALTHY"}.get(ups.get(name, ""), "unknown")
                gpus, model = planned.get(name, ("?", "not in the plan"))
                print(f"   {name:<14} {state:<10} {health:<10} last healthy {age:<10} GPU {gpus:<6} {model}")
            elif ln.startswith(("weights ", "download ")):
                print(f"   {ln}")
        if drift != "in sync":
            rc = 1
    return rc


def cmd_settings(a) -> int:
    """Every host-data key with its type, default and meaning (generated from settings.py)."""
    from . import settings

    print(settings.markdown_table() if a.markdown else settings.text_table(), end="")
    return 0


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


def _data(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        k, sep, v = pair.partition("=")
        if not sep:
            sys.exit(f"--data {pair!r} must be KEY=VALUE")
        out[k] = v
    return out


def cmd_rollout(a) -> int:
    from . import rollout

    try:
        o = rollout.rollout(a.inventory, batch=a.batch, canary=a.canary, max_failures=a.max_failures,
                            window=a.wait, limit=a.limit, data=_data(a.data), message=a.message)
    except (rollout.LockHeld, ValueError) as exc:
        print(f"rollout refused: {exc}", file=sys.stderr)
        return 2
    print(o.table())
    if o.halted:
        print(f"HALTED: {o.reason}", file=sys.stderr)
        return 1
    return 0 if all(r.result == "ok" for r in o.results) else 1


def cmd_rollback(a) -> int:
    from . import rollout

    try:
        o = rollout.rollback(a.inventory, a.limit, window=a.wait)
    except rollout.LockHeld as exc:
        print(f"rollback refused: {exc}", file=sys.stderr)
        return 2
    print(o.table())
    return 1 if o.halted else 0


def cmd_lock(a) -> int:
    from . import rollout

    try:
        hosts = rollout.inventory_hosts(a.inventory, a.limit)
    except ValueError as exc:
        print(f"lock refused: {exc}", file=sys.stderr)
        return 2
    if a.action == "status":
        for h, info in rollout.lock_status(a.inventory, hosts).items():
            print(f"{h:<14} " + (f"locked by {info['holder']} since {info['since']} {info.get('message', '')}" if info else "free"))
        return 0
    token = f"manual:{rollout.operator()}"  # a lock taken by hand is released by the same operator
    if a.action == "acquire":
        try:
            rollout.acquire(a.inventory, hosts, a.message, token=token)
        except rollout.LockHeld as exc:
            print(f"lock refused: {exc}", file=sys.stderr)
            return 2
        print(f"locked {len(hosts)} host(s)")
        return 0
    refused = rollout.release_all(a.inventory, hosts, token=token, force=a.force)
    if refused:
        print(f"lock release refused on {', '.join(refused)}: held by someone else (see `nemofleet lock status`); "
              "--force releases it anyway", file=sys.stderr)
        return 2
    print(f"released {len(hosts)} host(s)")
    return 0


def cmd_rebuild(a) -> int:
    from . import rollout

    t0 = time.time()
    try:
        stages = rollout.rebuild(a.inventory, a.host, a.accept_new_host_key, window=a.wait, data=_data(a.data))
    except RuntimeError as exc:
        print(f"rebuild of {a.host} failed: {exc}", file=sys.stderr)
        return 1
    for k, v in stages.items():
        print(f"  {k:<12} {v:6.1f}s")
    print(f"{a.host} rebuilt and serving in {time.time() - t0:.1f}s")
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
    st = sub.add_parser("settings", help="every host-data key, its type, default and meaning")
    st.add_argument("--markdown", action="store_true", help="the README's table")
    st.set_defaults(fn=cmd_settings)
    m = sub.add_parser("models", help="the model catalog")
    m.set_defaults(fn=cmd_models)
    r = sub.add_parser("rollout", help="rolling rollout in batches with a health gate")
    r.add_argument("inventory")
    r.add_argument("--batch", default="1", help="hosts per batch: N or P%% (default 1)")
    r.add_argument("--canary", type=int, default=0, help="hosts in a first, separate batch")
    r.add_argument("--max-failures", type=int, default=0, help="failure budget before halting (default 0)")
    r.add_argument("--wait", type=float, default=1200, help="startup window per host in seconds (default 1200)")
    r.add_argument("--limit", action="append", default=[])
    r.add_argument("--data", action="append", default=[], help="KEY=VALUE passed to pyinfra (the new release)")
    r.add_argument("--message", default="")
    r.set_defaults(fn=cmd_rollout)
    rb = sub.add_parser("rollback", help="return hosts to the release kept before the last one")
    rb.add_argument("inventory")
    rb.add_argument("--limit", action="append", default=[])
    rb.add_argument("--wait", type=float, default=1200)
    rb.set_defaults(fn=cmd_rollback)
    lk = sub.add_parser("lock", help="the deploy lock on each host")
    lk.add_argument("action", choices=["status", "acquire", "release"])
    lk.add_argument("inventory")
    lk.add_argument("--limit", action="append", default=[])
    lk.add_argument("--message", default="")
    lk.add_argument("--force", action="store_true", help="release a lock held by someone else")
    lk.set_defaults(fn=cmd_lock)
    rd = sub.add_parser("rebuild", help="disaster recovery: reinstalled host back to serving")
    rd.add_argument("inventory")
    rd.add_argument("host")
    rd.add_argument("--accept-new-host-key", action="store_true")
    rd.add_argument("--wait", type=float, default=1200)
    rd.add_argument("--data", action="append", default=[])
    rd.set_defaults(fn=cmd_rebuild)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
