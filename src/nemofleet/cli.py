"""nemofleet command line: plan, status, rollout, rollback, smoke, lock, rebuild, bundle, models,
settings and the testbed, one argparse parser (`nemofleet --help`, and each command's own --help,
list them with every option: the usage is generated from the parser, never written out twice).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import NoReturn


class _Refused(SystemExit):
    """A command refused before or while it ran (a bad inventory, facts file or --data, a
    FleetError): its sentence was printed on stderr and stays readable on the exception; _main
    returns its exit 2."""


def _refuse(sentence: str) -> NoReturn:
    print(sentence, file=sys.stderr)
    exc = _Refused(sentence)
    exc.code = 2  # usage: exit 2 (the sentence is printed above)
    raise exc


def _fleet(fn, what: str, *args, **kw):
    """Run a fleet call (driver.gather_facts, driver.host_specs, a command's own); a FleetError (bad
    option, no such host, lock held) is one sentence, `what: ...`, and exit 2."""
    from .fleet.driver import FleetError

    try:
        return fn(*args, **kw)
    except FleetError as exc:
        _refuse(f"{what}: {exc}")


MAX_FACTS_BYTES = 64 << 20  # a facts file of a large fleet is a few MiB
MAX_FACTS_DEPTH = 64  # HostFacts nests a handful of levels


def _json_depth(value) -> int:
    """How deeply lists and objects nest (iterative: a hostile file cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_FACTS_DEPTH:
                break
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _facts_file(path: str) -> dict:
    """{host: HostFacts} from a file; one sentence and exit 2 when it cannot be read. Only a regular
    file of at most MAX_FACTS_BYTES is read (a FIFO or device is refused from its stat, never
    opened), and JSON nested more than MAX_FACTS_DEPTH deep is refused."""
    import stat

    def refuse(why: str) -> NoReturn:
        _refuse(f"nemofleet: cannot read the facts file {path}: it {why}")

    try:
        st = os.stat(path)
    except FileNotFoundError:
        refuse("does not exist: no such file")
    except OSError as exc:
        refuse(f"cannot be read: {exc.strerror}")
    if not stat.S_ISREG(st.st_mode):
        refuse("is not a regular file (a directory, FIFO or device): give the JSON file `pyinfra --json fact` wrote")
    if st.st_size > MAX_FACTS_BYTES:
        refuse(f"is {st.st_size} bytes, more than the {MAX_FACTS_BYTES} a facts file may be: is it the right file?")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FACTS_BYTES + 1)
        facts = json.loads(raw.decode("utf-8"))
    except OSError as exc:
        refuse(f"cannot be read: {exc.strerror}")
    except UnicodeDecodeError as exc:
        refuse(f"is not UTF-8 text (byte {exc.start}): it must be JSON")
    except RecursionError:
        refuse(f"nests deeper than {MAX_FACTS_DEPTH} levels: it is not what HostFacts writes")
    except ValueError as exc:
        refuse(f"is not JSON ({exc})")
    if _json_depth(facts) > MAX_FACTS_DEPTH:
        refuse(f"nests deeper than {MAX_FACTS_DEPTH} levels: it is not what HostFacts writes")
    # the inner mapping as `pyinfra --json fact` writes it
    facts = facts.get("nemofleet.facts.host.HostFacts", facts) if isinstance(facts, dict) else None
    if not isinstance(facts, dict):
        refuse("must map host names to their facts")
    return facts


def cmd_plan(a) -> int:
    """What the deploy would apply, per host: the same decision (desired.decide over the same
    HostInputs, a serving group planned from all its members' facts), shown before it runs."""
    from . import inputs
    from . import valuetypes as vt
    from .desired import decide
    from .facts.host import facts_file_problem
    from .fleet import driver
    from .spec import to_resolve

    facts = _facts_file(a.facts) if a.facts else _fleet(driver.gather_facts, "nemofleet", a.inventory, a.limit)
    specs = _fleet(driver.host_specs, "nemofleet", a.inventory, a.limit)
    if not a.facts:
        commits = driver.resolve_commits(a.inventory, {h: to_resolve(sp) for h, sp in specs.items() if h in facts})
    else:
        commits = {}  # a facts file: no host to ask, a revision is planned as it is named
    result: dict[str, dict] = {}
    fan, fan_lines = _plan_fanout(specs, facts)
    # a member's missing or unusable facts: PeerMissing with its sentence (not "outside this run")
    members = {m for sp in specs.values() for m in sp.members}
    typed = {h: _peer_facts(h, facts.get(h), a.facts) for h in {*facts, *members}}
    planned = {}
    for name in specs:
        f = facts.get(name)
        why = "no facts (host unreachable?)" if f is None else facts_file_problem(name, f) if a.facts else None
        if why:
            result[name] = {"refused": [why], "codes": ["facts"], "warnings": []}
            continue
        planned[name] = dict(f or {}, lock=None)
    every = inputs.gather(specs, {**typed, **planned}, hosts=list(planned), commits=commits,
                          seeds={h: fan.seed_from(h) for h in planned}, operator=driver.operator())
    for name, i in every.items():
        try:
            d = decide(i)
        except Exception as exc:  # a shape no parser caught: this host only, never the fleet
            result[name] = {"refused": [f"nemofleet could not plan this host ({type(exc).__name__}: {exc}); "
                                        "its facts or host data hold a value of an unexpected type"], "warnings": []}
            continue
        result[name] = {"refused": d.refusals, "codes": [vt.code_of(r) for r in d.refusals], "warnings": d.warnings,
                        "plan": d.plan.to_dict() if d.plan else None}
        if d.plan is None and d.preview is not None:
            # refused for something outside the plan (no API key on this controller yet...): the
            # instances, flags and memory it would run once the refusals are fixed
            result[name]["preview"] = d.preview.to_dict()
        tiny = _tiny_checkpoint(i.facts, result[name]["plan"])
        if tiny:
            result[name]["notes"] = [tiny]
    result = {h: result[h] for h in specs if h in result}  # inventory order
    rc = 1 if any(r["refused"] for r in result.values()) else 0  # a host refused
    if a.json:
        print(json.dumps(result, indent=2))
        return rc
    from .plan_table import lines  # columns sized to their content (8-GPU instances, long names)

    # a warning that several hosts share is said once, after the hosts, naming them
    warned: dict[str, list[str]] = {}
    for name, r in result.items():
        for w in r.get("warnings", []):
            warned.setdefault(w, []).append(name)
    # wrapped within WIDTH for a person at a terminal; piped (grep, files) and with -v each line whole
    wrap = not a.verbose and sys.stdout.isatty()
    say = _say if wrap else (lambda prefix, text: print(prefix + text))
    for name, r in result.items():
        print(f"== {name}")
        for s in r["refused"]:
            say("   REFUSED: ", s)
        for w in r.get("warnings", []):
            if len(warned[w]) == 1:
                say("   warning: ", w)
        n_shared = sum(len(warned[w]) > 1 for w in r.get("warnings", []))
        if n_shared:
            print(f"   warnings: {n_shared} shared with other hosts, said once below")
        p = r.get("plan")
        if r["refused"] and r.get("preview"):
            p = r["preview"]
            print("   once the refusals above are fixed, it would run:")
        elif not p or r["refused"]:
            continue
        for line in lines(p) + [f"note: {n}" for n in r.get("notes", [])]:
            if wrap and line.startswith("flags"):
                for part in _flag_lines(line):
                    print(f"   {part}")
            else:
                say("   ", line)
    shared = {w: hosts for w, hosts in warned.items() if len(hosts) > 1}
    if shared:
        print("== warnings shared by several hosts (said once)")
        for w, hosts in shared.items():
            say("   ", f"warning ({'every host' if len(hosts) == len(result) else ', '.join(hosts)}): {w}")
    if fan_lines:
        print("== weights fan-out of a converge of these hosts (a rollout decides again before each batch, "
              "from the hosts that hold the model then; docs/fanout.md)")
        for line in fan_lines:
            print(f"   {line}")
    return rc


WIDTH = 120  # `nemofleet plan` text stays within this many columns (-v prints lines whole)
VALUE_SHOWN = 40  # a flag value longer than this is shortened in the text (whole with -v or --json)


def _say(prefix: str, text: str) -> None:
    """Print `text` after `prefix`, wrapped at WIDTH, later lines indented under the first."""
    import textwrap

    print(textwrap.fill(text, WIDTH, initial_indent=prefix, subsequent_indent=" " * (len(prefix) + 2),
                        break_long_words=False, break_on_hyphens=False))


def _flag_lines(line: str) -> list[str]:
    """A plan's `flags: --a 1 --b 2 ...` line as lines of whole flags within WIDTH, long values
    (JSON configs) shortened with '...'."""
    label, _, args = line.partition(": ")
    words = args.split(" ")
    groups: list[str] = []
    for w in words:
        if w.startswith("--") or not groups:
            groups.append(w)
        else:
            groups[-1] += " " + (w if len(w) <= VALUE_SHOWN else w[:VALUE_SHOWN - 3] + "...")
    out, cur = [], f"{label}:"
    for g in groups:
        if len(cur) + 1 + len(g) + 3 > WIDTH and cur.strip() != f"{label}:":
            out.append(cur)
            cur = " " * 4
        cur += " " + g
    return out + [cur]


def _tiny_checkpoint(facts, plan: dict | None) -> str | None:
    """A sentence when the weights the plan sized its memory from are the testbed's tiny stand-in
    checkpoint (nemofleet_testbed.tinymodel marks its config.json with `nemofleet_tiny`): its few
    GiB, not the real model's size, drive the GiB figures. `facts`: the host's typed Facts."""
    from .models import host_dir_name, local_dir_name

    if not plan:
        return None
    # the directory desired.checkpoint_meta reads: this commit's, else any of the same repo
    repo = local_dir_name(plan["repo"])
    dirs = [host_dir_name(plan["repo"], plan["revision"])] + sorted(
        n for n in facts.models if n.split("@", 1)[0] == repo)
    for d in dirs[:2] if dirs[0] not in facts.models else dirs[:1]:
        meta = facts.models.get(d)
        if meta is not None and meta.config is not None and meta.config.nemofleet_tiny:
            size = f"{meta.total_size / 1024**3:.1f} GiB" if meta.total_size is not None else "a few GiB"
            return (f"the weights on this host are the testbed's tiny checkpoint ({size}), not {plan['repo']}: "
                    "the memory figures use its size")
    return None


def _plan_fanout(specs: dict, facts: dict):
    """The weights fan-out a converge of these hosts decides (docs/fanout.md; the same
    fanout.for_run as the deploy, over the hosts it would reach: those with facts), and the
    lines to show: the copies of hosts whose facts show the model's directory incomplete."""
    from . import factmodel, fanout
    from .models import host_dir_name

    run = fanout.for_run({h: sp for h, sp in specs.items() if isinstance(facts.get(h), dict)})
    holders = {}
    for h, c in run.fan.copies.items():
        meta = factmodel.parse(facts[h])[0].models.get(host_dir_name(*c.key))  # a bad part: no models
        if meta is not None and meta.complete:
            holders[h] = {c.key}
    return run, run.lines(holders)


def _peer_facts(member: str, facts, from_file: bool):
    """A serving group member's facts, or factmodel.PeerMissing when there are none to plan with."""
    from .factmodel import PeerMissing
    from .facts.host import facts_file_problem

    if not facts:
        return PeerMissing(why="has no facts (unreachable, or not in the facts file)")
    why = facts_file_problem(member, facts) if from_file else None
    return PeerMissing(why=f"has facts nemofleet cannot read ({why})") if why else facts


def cmd_status(a) -> int:
    """Per host: release (and drift from the inventory's plan), units, health, weights, downloads."""
    from .fleet import status

    rows = _fleet(status.status, "status refused", a.inventory, a.limit)
    for r in rows:
        print(f"== {r.host}")
        if not r.reachable:
            print("   unreachable")
            continue
        for p in r.problems:
            print(f"   setting: {p}")
        print(f"   release {r.release or 'none'} ({r.drift()})")
        for line in r.lines:
            print(f"   {line}")
    return 0 if all(r.in_sync for r in rows) else 1  # in sync: reachable and on the planned release


def cmd_smoke(a) -> int:
    """One chat completion per host, asked on the host (nemofleet.fleet.smoke); exit 1 when any fails."""
    from .fleet import smoke

    answers = _fleet(smoke.smoke, "smoke refused", a.inventory, a.limit, a.prompt, a.max_tokens)
    if a.json:
        print(json.dumps([dataclasses.asdict(x) for x in answers], indent=2))
    else:
        for line in smoke.table(answers):
            print(line)
    failed = [x.host for x in answers if not x.ok]
    if failed:
        print(f"smoke: {len(failed)} of {len(answers)} host(s) did not answer: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def cmd_bundle(a) -> int:
    """nemofleet bundle create|verify|show (nemofleet.bundle)."""
    from .fleet import bundle, driver

    return bundle.main(a, lambda inv, path: _facts_file(path) if path else
                       _fleet(driver.gather_facts, "nemofleet", inv, []),
                       lambda inv: _fleet(driver.host_specs, "nemofleet", inv, []))


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
    """The local testbed is a separate package (nemofleet-testbed, testbed/ in the repository),
    not in the nemofleet wheel: run it where it is installed, else say what to install."""
    try:
        from nemofleet_testbed.cli import run
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "nemofleet_testbed":
            raise
        _refuse("nemofleet: `nemofleet testbed` needs the nemofleet-testbed package, which is not installed here: "
                "in a nemofleet checkout run `make venv` (or `pip install -e ./testbed`)")
    return run(a)


def _data(pairs: list[str]) -> dict:
    """--data KEY=VALUE pairs; a malformed pair or a secret is one sentence and exit 2."""
    from . import settings

    out = {}
    for pair in pairs:
        k, sep, v = pair.partition("=")
        if not sep or not k:
            _refuse(f"nemofleet: --data {settings.vt.shown(pair)} must be KEY=VALUE "
                    "(e.g. --data model=nemotron-3-nano-bf16)")
        why = settings.command_line_secret(k, v)
        if why:
            _refuse(f"nemofleet: {why}")
        out[k] = v
    return out


def _seconds(text: str) -> float:
    """--wait: a finite number of seconds from 1 to 86400 (NaN compares false with every bound,
    and a wait of inf never ends)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds from 1 to 86400")
    return value


def _fingerprint(text: str) -> str:
    """--expect-host-key: an SSH host key fingerprint as `ssh-keygen -lf` prints it (the
    expected_host_key setting's own pattern), checked before any connection."""
    import re

    from . import settings

    if not re.fullmatch(settings.BY_NAME["expected_host_key"].pattern or "", text):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a fingerprint as ssh-keygen -lf prints it "
                                         "(SHA256: and 43 base64 characters)")
    return text


def _tokens(text: str) -> int:
    """--max-tokens: a whole number of tokens from 1 to 1,000,000."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a whole number of tokens") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} must be from 1 to 1000000 tokens")
    return value


MESSAGE_MAX = 1000  # characters of a lock --message: one line of the lock's info file and of each audit log


def _message(text: str) -> str:
    """--message: refused before any host is asked when longer than MESSAGE_MAX (it travels on the
    SSH command line of the lock program)."""
    if len(text) > MESSAGE_MAX:
        raise argparse.ArgumentTypeError(f"is {len(text)} characters; a lock message is at most {MESSAGE_MAX} (one "
                                         "line of the lock's info file and the audit log): shorten it")
    return text


def _prompt(text: str) -> str:
    """--prompt, or the text of --prompt-file: refused before any host is asked when its request
    would not fit on the SSH command line (fleet.smoke.MAX_BODY)."""
    from .fleet import smoke

    size = len(smoke.body(text))
    if size > smoke.MAX_BODY:
        raise argparse.ArgumentTypeError(f"the prompt is {size} bytes as the request's JSON; at most {smoke.MAX_BODY} "
                                         "travel on the SSH command line (Linux caps one argument at 128 KiB): "
                                         "shorten it")
    return text


def _prompt_file(path: str) -> str:
    """--prompt-file FILE (`-`: stdin): the prompt as UTF-8 text, then as --prompt."""
    from .fleet import smoke

    try:
        if path == "-":
            return _prompt(sys.stdin.read(smoke.MAX_BODY + 1))
        with open(path, encoding="utf-8") as f:
            return _prompt(f.read(smoke.MAX_BODY + 1))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(f"{path!r} is not UTF-8 text") from None


def _ttl(a) -> int:
    from .lock import fleet as lock

    return lock.parse_ttl(a.lock_ttl)


def cmd_rollout(a) -> int:
    """Exit 0 ok; 1 rolled back or halted; 2 refused (bad option, lock held); 130 interrupted.
    --json: one JSON document on stdout (result ok|rolled_back|halted|refused, hosts, batches);
    every human line goes to stderr."""
    from . import canary
    from . import valuetypes as vt
    from .fleet import rollout

    def say(line: str) -> None:
        print(line, file=sys.stderr if a.json else sys.stdout, flush=True)

    def refused(why: str) -> NoReturn:
        if a.json:
            print(json.dumps({"result": "refused", "code": 2, "reason": why, "problems": [why], "hosts": {},
                              "batches": []}))
        _refuse(f"rollout refused: {why}")

    slo = canary.Slo(error_points=a.slo_error_rate, latency_ratio=a.slo_latency_ratio,
                     min_requests=a.slo_min_requests, on_thin=a.on_thin_traffic)
    try:
        canary.check_slo(slo)
    except ValueError as exc:
        return refused(str(exc))
    if not (a.bake == 0 or 1 <= a.bake <= 86400):
        return refused(f"--bake {a.bake:g} must be 0 (no bake) or from 1 to 86400 seconds")
    given = a.canary_steps or a.canary_weight
    shares = [s.strip().removesuffix("%") for s in given.split(",")]
    # ASCII digits only (int() reads '١٠' as 10), at most 10 steps, each above the one before
    if (len(shares) > 10 or not all(s.isascii() and s.isdigit() and 1 <= int(s) <= 99 for s in shares)
            or any(int(x) >= int(y) for x, y in zip(shares, shares[1:]))):
        return refused(f"--canary-{'steps' if a.canary_steps else 'weight'} {vt.shown(given)} must be percentages "
                       "from 1 to 99 (at most 10 steps, each above the last, e.g. 10,25,50) of the gateway's requests")
    if a.pause_after_canary and not a.canary:
        return refused("--pause-after-canary needs a canary batch: add --canary N")
    if a.pause_after_canary and not sys.stdin.isatty():
        return refused("--pause-after-canary asks promote or abort on the terminal, and stdin is not one: run it "
                       "from a terminal, or roll out the canary alone (--limit) and then the rest")
    from .fleet.driver import FleetError

    try:
        o = rollout.rollout(
            a.inventory, batch=a.batch, canary=a.canary, max_failures=a.max_failures, window=a.wait, limit=a.limit,
            data=_data(a.data), message=a.message, ttl=_ttl(a), log=say, bake_seconds=a.bake, slo=slo,
            pause_after_canary=a.pause_after_canary, gateway_drain=not a.no_gateway_drain,
            canary_steps=tuple(int(s) / 100 for s in shares),
            ask=lambda q: (print(q, end="", file=sys.stderr, flush=True), sys.stdin.readline())[1])
    except FleetError as exc:
        return refused(str(exc))
    except KeyboardInterrupt:  # before the first batch started: nothing changed, the lock is given back
        print("rollout interrupted before any host was changed", file=sys.stderr)
        if a.json:
            print(json.dumps({"result": "halted", "reason": "interrupted (Ctrl-C) before any batch", "hosts": {},
                              "batches": []}))
        return 130
    for line in o.table().splitlines():
        say(line)
    for b in o.batches:
        if "canary_figures" in b:
            say(f"{b['label']} ({', '.join(b['hosts'])}): {b['verdict']}: {b['reason']}")
    if o.halted:
        print(f"HALTED: {o.reason}", file=sys.stderr)
    say(o.summary())
    if a.json:
        print(json.dumps(o.to_json(), indent=2))
    if o.interrupted:
        return 130
    return 0 if o.ok else 1


def cmd_rollback(a) -> int:
    from .fleet import rollout

    o = _fleet(lambda: rollout.rollback(a.inventory, a.limit, window=a.wait, ttl=_ttl(a),
                                        gateway_drain=not a.no_gateway_drain), "rollback refused")
    print(o.table())
    return 0 if o.ok else 1


def cmd_lock(a) -> int:
    from .lock import info as lockinfo
    from .fleet import driver
    from .lock import fleet as lock

    hosts = _fleet(driver.hosts, "lock refused", a.inventory, a.limit)
    if a.action == "status":
        for h, info in lock.status(a.inventory, hosts).items():
            if info and "error" in info:
                print(f"{h:<14} unknown: {info['error']}")
            elif info:
                print(f"{h:<14} locked by {lockinfo.describe(info)}, {lockinfo.until(info, info.get('now'))}")
            else:
                print(f"{h:<14} free")
        return 0
    # a lock taken by hand: its token is a random secret printed once, to its holder (or the one
    # already exported, to lock more hosts under it); releasing it needs that token or --force
    token = os.environ.get(driver.LOCK_TOKEN_ENV) or None
    if a.action == "acquire":
        held = _fleet(lambda: lock.acquire(a.inventory, hosts, a.message, _ttl(a), token), "lock refused")
        print(f"locked {len(held.hosts)} host(s) for {held.ttl // 60} min; deploys under this lock (and its "
              f"release) need its token, shown only now:\nexport {driver.LOCK_TOKEN_ENV}={held.token}")
        return 0
    if not a.force:
        if not token:
            _refuse(f"lock release refused: it needs the holder's token in {driver.LOCK_TOKEN_ENV} (printed once by "
                    "`nemofleet lock acquire`), or --force to break an abandoned lock")
        _fleet(lock.check_token, "lock release refused", token)
    answers = lock.release_hosts(a.inventory, hosts, token, a.force)
    for h, sentence in answers.items():
        print(f"{h:<14} {sentence}")
    unreachable = [h for h, sentence in answers.items() if sentence.startswith("NOT released: unreachable")]
    refused = [h for h, sentence in answers.items() if sentence.startswith("NOT") and h not in unreachable]
    if unreachable:
        print(f"lock release could not reach {', '.join(unreachable)}: its lock (if any) stays until it expires "
              "or a release reaches it", file=sys.stderr)
    if refused:
        print(f"lock release refused on {', '.join(refused)}: held by someone else (`nemofleet lock status`); "
              "--force releases it anyway", file=sys.stderr)
    return 2 if refused or unreachable else 0


def cmd_rebuild(a) -> int:
    from .fleet import rebuild

    t0 = time.time()
    try:
        stages = _fleet(lambda: rebuild.rebuild(
            a.inventory, a.host, a.accept_new_host_key, expect_host_key=a.expect_host_key, yes=a.yes,
            window=a.wait, data=_data(a.data), ttl=_ttl(a), gateway_drain=not a.no_gateway_drain), "rebuild refused")
    except rebuild.RebuildError as exc:
        print(f"rebuild of {a.host} failed: {exc}", file=sys.stderr)
        return 1
    for k, v in stages.items():
        print(f"  {k:<12} {v:6.1f}s")
    print(f"{a.host} rebuilt and serving in {time.time() - t0:.1f}s")
    return 0


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks and shows each option's default when its help does not
    already say it ("none" for an option that is absent unless given; flags are off unless given)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))  # off unless given
        if not action.option_strings or flag or "default" in text or default is argparse.SUPPRESS:
            return text
        if default is None or default == [] or default == "":
            return text + " (default: none)"
        return text + " (default: %(default)s)"


# each command's exit codes, the end of its --help (and 2 and 130 for every command)
EXIT_CODES = {
    "plan": "0 every host planned; 1 a host is refused (its sentences say why)",
    "status": "0 every host in sync; 1 a host drifts, is unreachable or its plan is refused",
    "smoke": "0 every host answered; 1 a host did not",
    "rollout": "0 every batch rolled out; 1 a batch was rolled back or the rollout halted",
    "rollback": "0 every host is back on its previous release; 1 a host is not",
    "lock": "0 done on every host (status: always); 2 also when a host did not answer or holds another's lock",
    "rebuild": "0 the host is rebuilt and serving; 1 the rebuild failed (the sentence says where)",
    "bundle": "0 written, verified or shown; 1 refused (a bad signature, signer or byte, a part that cannot be "
              "fetched: its sentence says which)",
    "settings": "0 printed",
    "models": "0 printed",
    "testbed": "0 done; 1 a step failed (its output is above)",
}


def parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        installed = version("nemofleet")
    except PackageNotFoundError:
        installed = __version__
    ap = argparse.ArgumentParser(
        prog="nemofleet", formatter_class=_Formatter,
        description="nemofleet: NVIDIA Nemotron models on vLLM across GPU fleets, provisioned with pyinfra.\n"
                    "The deploy itself is `pyinfra INVENTORY deploys/nemotron.py`; these commands plan, check and\n"
                    "roll it out. `nemofleet COMMAND --help` shows a command's options.",
        epilog="First time here: `make demo` (README.md, Set up). Exit codes: each command's --help lists them.")
    ap.add_argument("--version", action="version", version=f"nemofleet {installed}")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND", title="commands")

    # the options several commands share, by name: each added with one definition and one wording
    shared: dict[str, dict] = {
        "inventory": dict(help="the pyinfra inventory file (e.g. inventories/testbed.py)"),
        "--limit": dict(action="append", default=[],
                        help="only this host or group (a glob on host names); repeat for more (default: every host)"),
        "--wait": dict(type=_seconds, default=1200, help="seconds each host may take to start serving"),
        "--data": dict(action="append", default=[],
                       help="KEY=VALUE host data for this run, as pyinfra's --data (repeatable; secrets refused)"),
        "--message": dict(type=_message, default="", help="a note recorded with the lock and in each host's audit log"),
        "--lock-ttl": dict(default="2h", help="the deploy lock's expiry: seconds or N[smhd] (default 2h, at most 7d)"),
        "--no-gateway-drain": dict(action="store_true", help="go on when the inventory's gateway cannot be reached: "
                                   "hosts are not drained there (clients may see failed requests)")}

    def opts(p, *names: str) -> None:
        for name in names:
            p.add_argument(name, **shared[name])

    def add(name: str, help: str, fn, description: str | None = "", *options: str):
        """A command; description "" is its help as a sentence; `options` are names of `shared`."""
        p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + "." if description == ""
                           else description, formatter_class=_Formatter,
                           epilog=f"exit codes: {EXIT_CODES[name]}; 2 refused before anything ran (a bad option, "
                                  "inventory or --data); 130 interrupted")
        p.set_defaults(fn=fn)
        opts(p, *options)
        return p

    p = add("plan", "print the serving plan per host, read-only (what the deploy would apply)", cmd_plan, "", "inventory", "--limit")
    p.add_argument("--json", action="store_true", help="print the full plans as JSON")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each line whole at a terminal too (flag values unshortened, no wrapping at 120 columns; "
                        "piped output is always whole)")
    p.add_argument("--facts", metavar="FILE",
                   help="plan from this facts JSON ({host: HostFacts}, as `pyinfra --json fact` writes it) instead "
                        "of reading the hosts (default: read them over SSH)")
    s = add("status", "release, drift from the inventory's plan, units, health and weights per host", cmd_status, "",
            "inventory", "--limit")
    sm = add("smoke", "one chat completion per host (first words, tokens, latency); exit 1 when any fails", cmd_smoke,
             "One chat completion per host, asked on the host over SSH through its front door or first instance;\n"
             "the API key is read on the host from its 0600 file and never put on a command line.",
             "inventory", "--limit")
    said = sm.add_mutually_exclusive_group()
    said.add_argument("--prompt", type=_prompt, default="What is 17*23? Answer in one sentence.",
                      help="the user message to send")
    said.add_argument("--prompt-file", dest="prompt", type=_prompt_file, metavar="FILE",
                      help="the user message from this file (UTF-8; - reads stdin), for a long one (default: none)")
    sm.add_argument("--max-tokens", type=_tokens, default=512, help="the completion's max_tokens (reasoning included)")
    sm.add_argument("--json", action="store_true", help="print each host's answer as JSON")
    r = add("rollout", "rolling rollout in batches with a health gate", cmd_rollout, None, "inventory")
    r.add_argument("--batch", default="1", help="hosts per batch: N or P%% (default 1)")
    r.add_argument("--canary", type=int, default=0, help="hosts in a first, separate batch")
    r.add_argument("--max-failures", type=int, default=0, help="failure budget before halting (default 0)")
    r.add_argument("--wait", type=_seconds, default=1200, help="startup window per host in seconds (default 1200)")
    opts(r, "--limit")
    r.add_argument("--data", action="append", default=[], help="KEY=VALUE passed to pyinfra (the new release)")
    opts(r, "--message", "--lock-ttl")
    r.add_argument("--bake", type=float, default=120,
                   help="seconds each batch is watched after its health gate, its request metrics compared with "
                        "the baseline's; a breach rolls it back and halts (default 120, 0 = health gate only)")
    r.add_argument("--slo-error-rate", type=float, default=1.0,
                   help="percentage points of failed (5xx) requests the batch may have above the baseline (default 1)")
    r.add_argument("--slo-latency-ratio", type=float, default=1.5,
                   help="how many times the baseline's p95 TTFT and p95 end-to-end latency the batch may reach "
                        "(default 1.5)")
    r.add_argument("--slo-min-requests", type=int, default=50,
                   help="requests each side must serve in the bake before it is judged (default 50)")
    r.add_argument("--on-thin-traffic", default="wait", choices=["pass", "fail", "wait"],
                   help="when a side served fewer: wait (the default: a batch without traffic while the baseline "
                        "has some bakes up to twice as long, then is rolled back; an idle fleet passes unjudged), "
                        "fail (roll back), pass (promote unjudged)")
    r.add_argument("--pause-after-canary", action="store_true",
                   help="after the canary passes, ask on the terminal: promote (go on) or abort (roll it back)")
    r.add_argument("--canary-weight", default="10%",
                   help="with a gateway: the canary batch's share of its requests while it bakes (default 10%%)")
    r.add_argument("--canary-steps", default="", metavar="P,P,...",
                   help="with a gateway: bake the canary at these shares in turn (e.g. 10,25,50), each judged")
    r.add_argument("--json", action="store_true", help="one JSON document on stdout; human lines on stderr")
    opts(r, "--no-gateway-drain")
    add("rollback", "return hosts to the release kept before the last one", cmd_rollback, None,
        "inventory", "--limit", "--wait", "--lock-ttl", "--no-gateway-drain")
    lk = add("lock", "show, take or release the deploy lock on each host", cmd_lock)
    lk.add_argument("action", choices=["status", "acquire", "release"], help="what to do with the lock")
    opts(lk, "inventory", "--limit", "--message")
    lk.add_argument("--force", action="store_true", help="release a lock held by someone else")
    opts(lk, "--lock-ttl")
    rd = add("rebuild", "disaster recovery: a reinstalled host back to serving", cmd_rebuild, "", "inventory")
    rd.add_argument("host", help="the reinstalled host (one host of the inventory)")
    rd.add_argument("--accept-new-host-key", action="store_true", help="replace a changed SSH host key")
    rd.add_argument("--expect-host-key", metavar="SHA256:...", type=_fingerprint,
                    help="the fingerprint the new host key must have, read on the host's console (default: none)")
    rd.add_argument("--yes", action="store_true", help="trust a new host key without an expected fingerprint")
    opts(rd, "--wait", "--data", "--lock-ttl", "--no-gateway-drain")
    bd = add("bundle", "one signed file with every image, weight and package the plans need (air-gap)",
             cmd_bundle,
             "One signed file with every image, weight and package the inventory's plans need, for fleets\n"
             "with no route out (docs/air-gap.md); the deploy takes them from it with --data bundle=FILE.")
    bsub = bd.add_subparsers(dest="action", metavar="ACTION", required=True, help="create, verify or show")
    bc = bsub.add_parser("create", help="collect what the hosts' plans need, sign it, write FILE",
                         formatter_class=_Formatter)
    bc.add_argument("inventory", **shared["inventory"])
    bc.add_argument("-o", "--output", metavar="FILE", required=True,
                    help="the bundle to write (no default; a re-run resumes from FILE.parts/)")
    bc.add_argument("--facts", metavar="FILE", help="plan from this facts JSON instead of reading the hosts "
                    "(default: read them over SSH)")
    bv = bsub.add_parser("verify", help="check the signature and every part's SHA-256", formatter_class=_Formatter)
    bv.add_argument("file", help="the bundle")
    bv.add_argument("inventory", nargs="?", help="its bundle_allowed_signers_file is trusted (default: none)")
    bv.add_argument("--allowed-signers", metavar="FILE", help="ssh-keygen allowed signers file (default: the "
                    "inventory's bundle_allowed_signers_file, else ~/.config/nemofleet/allowed_signers)")
    bsub.add_parser("show", help="what the bundle holds and whom it serves").add_argument("file", help="the bundle")
    st = add("settings", "every host-data key with its type, default and meaning", cmd_settings)
    st.add_argument("--markdown", action="store_true", help="print the Markdown table of docs/settings.md")
    add("models", "the model catalog: repository, precision, size, parsers", cmd_models)
    t = add("testbed", "the local testbed of simulated GPU hosts (make demo starts it)", cmd_testbed,
            "The local testbed of simulated GPU hosts: the nemofleet-testbed package (testbed/ in the\n"
            "repository, installed by make venv), not part of the nemofleet wheel.")
    t.add_argument("action", choices=["up", "down", "status", "recreate", "gpu-fault"],
                   help="up: build and start; down: remove; status: list; recreate HOST...: a fresh host; "
                        "gpu-fault HOST GPU KIND: a simulated GPU fault")
    t.add_argument("hosts", nargs="*", help="host names (up: only these; recreate, gpu-fault: which)")
    t.add_argument("--demo", action="store_true",
                   help="up: only the hosts make demo uses (not broken-1, which only the tests refuse)")
    t.add_argument("--profile", default="default",
                   help="the testbed profile: a name in testbed/src/nemofleet_testbed/profiles, or a .yaml file")
    return ap


# the commands whose INVENTORY argument is checked before they run
def _inventory_problem(inventory: str) -> str | None:
    """One sentence when the inventory cannot be loaded (no such file, a directory, not UTF-8,
    an inventory or group data file that raises), None when it loads."""
    from . import inventory as inv
    from .fleet import driver

    why = inv.file_problem(inventory)
    if why or not inv.names_a_file(inventory):  # host names (web1,web2 or @docker/...) are pyinfra's to check
        return why
    try:
        driver._inventory(inventory)
    except SystemExit as exc:  # an inventory that stops itself (the testbed's: "not up") says why
        return str(exc.code) if isinstance(exc.code, str) else f"the inventory {inventory} exited ({exc.code})"
    except Exception as exc:
        return inv.load_problem(inventory, exc)
    return None


class _Terminal:
    """sys.stdout or sys.stderr while a command runs: whoever writes (a sentence, a host's unit name
    or lock holder, a plan), every character a terminal acts on is escaped (valuetypes.printable:
    ESC, the C0/C1 controls, U+2028/U+2029/U+0085, bidi controls; newlines and tabs kept); what was
    written is kept for the --json contract (main)."""

    def __init__(self, stream):
        self.stream, self.said = stream, []

    def write(self, text: str) -> int:
        from .valuetypes import printable

        text = printable(text, keep="\n\t")
        self.said.append(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv=None) -> int:
    """Run one command. With --json, every outcome is one JSON document on stdout: a command that
    printed none (a refusal before it started, an interruption, an unexpected error) gets
    {"result": "refused"|"interrupted"|"failed", "code": EXIT, "problems": [its stderr sentences]}."""
    argv = sys.argv[1:] if argv is None else list(argv)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err = _Terminal(sys.stdout), _Terminal(sys.stderr)
    rc, exit_ = 2, None
    try:
        rc = _main(argv)
    except SystemExit as exc:  # argparse, a refused --data or facts file: the same contract, then exit as before
        exit_ = exc
        rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        sys.stdout, sys.stderr = streams
    if "--json" in argv and rc and not "".join(out.said).strip():
        problems = [ln for ln in "".join(err.said).splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
        print(json.dumps({"result": {2: "refused", 130: "interrupted"}.get(rc, "failed"), "code": rc,
                          "problems": problems[-20:]}))
    if exit_ is not None:
        raise exit_
    return rc


def _main(argv: list[str]) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if not getattr(a, "fn", None):  # `nemofleet` alone: what it can do
        ap.print_help()
        return 2
    try:
        if getattr(a, "inventory", None) is not None:
            why = _inventory_problem(a.inventory)
            if why:
                _refuse(why if why.startswith("nemofleet") else f"nemofleet: {why}")
        return a.fn(a)
    except _Refused:  # its sentence is printed
        return 2
    except KeyboardInterrupt:
        print("nemofleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `nemofleet plan ... | head`
        return 0
    except Exception as exc:  # a last resort: the known classes are handled where they arise
        try:
            text = " ".join(str(exc).split())[:300]
        except Exception:
            text = ""
        print(f"nemofleet {a.cmd}: unexpected {type(exc).__name__}{': ' + text if text else ''} "
              "(a bug: please report it with the command that caused it)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
