"""Model weights: fetch with the vLLM image's own `hf` CLI through the Hugging Face mirror,
verify offline, resume by re-fetching only what is missing or truncated, never re-download.
"""

from __future__ import annotations

import io
import os
import re
import time

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand, operation

from .. import fanout, paths, remote, shell
from . import cmd, fail_command
from ..facts.weights import MARKER, WeightsStatus, check_command
from ..facts.prefetch import fact
from ..models import is_commit
from . import reads_with

DOWNLOAD_PREFIX = "nemofleet-weights-"

# Runs on the host before any byte is fetched (remote/hub.py `precheck`): is the mirror up, does
# repo@revision exist, is there disk for what is still missing? One sentence and exit 1 otherwise.
# The token is read from its 0600 file, never passed on a command line, and never follows a
# redirect to another host. Two questions to the mirror: the program's own deadline is
# PRECHECK_TIMEOUT - 15 s (it then says which mirror did not answer), `timeout` the bound behind it.
PRECHECK_TIMEOUT = 60


def precheck_command(directory: str, repo: str, revision: str, endpoint: str | None, token_file: str | None,
                     present_bytes: int) -> str:
    return shell.join(["timeout", PRECHECK_TIMEOUT,
                       *remote.argv("hub", "precheck", directory, repo, revision, endpoint or "https://huggingface.co",
                                    token_file or "", int(present_bytes), PRECHECK_TIMEOUT - 15)])


# A download has no total bound (232 GB on a slow mirror is hours): it is stopped when its directory
# has not grown for this long (no byte moved), the way rsync's --timeout bounds the peer copy.
STALL_SECONDS = 600
STALL_POLL = 15

# stall_guard UNIT DIR SECONDS: while UNIT runs, stop it once DIR (the download's files and its
# .incomplete parts) has not grown for SECONDS; returns 1 when it had to stop it.
STALL_GUARD = (
    "stall_guard() { last=-1; idle=0; while systemctl is-active -q \"$1\"; do "
    "now=$(timeout 60 du -sb \"$2\" 2>/dev/null | cut -f1); "
    "if [ \"$now\" = \"$last\" ]; then idle=$((idle + %(poll)d)); else idle=0; last=$now; fi; "
    "if [ $idle -ge \"$3\" ]; then timeout 60 systemctl stop \"$1\"; return 1; fi; "
    "sleep %(poll)d; done; return 0; }" % {"poll": STALL_POLL})


def slug(directory: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", directory.rstrip("/").rsplit("/", 1)[-1])[:80]


def weights_ok(directory: str, revision: str) -> str:
    """A shell condition: the weights in `directory` are complete and of this commit (HF metadata)."""
    return (f"{{ st=$({check_command(directory, revision, 'check')} 2>/dev/null || true); "
            "echo \"$st\" | grep -q '\"commit_ok\": true' && echo \"$st\" | grep -q '\"complete\": true'; }")


def seed_lines(seed: dict | list, directory: str, revision: str, verified: str | None = None) -> list[str]:
    """Copy the weights from a peer that has them complete (rsync over SSH); on any failure,
    fall back to the mirror. The completion marker is not copied: this host verifies itself.
    Several peers (a list: the fleet fan-out's sources, docs/fanout.md) are tried in order until
    one copy is complete and of this commit; each resumes what the one before left (--partial).
    `verified`: the shell condition a copy must pass instead (a bundle's image archive: its SHA-256)."""
    peers = seed if isinstance(seed, list) else [seed]
    return [line for peer in peers for line in _seed_lines(peer, directory, verified or weights_ok(directory, revision))] + [
        # no peer had it: a file a copy left half-written (its metadata copied with it) is removed,
        # so that `hf download` fetches it rather than trusting the metadata
        f"{check_command(directory, revision, 'clean')} >/dev/null 2>&1 || true" if not verified else "true"]


def _seed_lines(seed: dict, directory: str, verified: str) -> list[str]:
    q = shell.quote
    ssh = (f"ssh -i {q(seed.get('key', paths.SEED_KEY))} -p {int(seed.get('port', 22))} -o BatchMode=yes "
           f"-o ConnectTimeout=10 -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={paths.SEED_KNOWN_HOSTS}")
    # the peer's key is restricted to `rrsync -ro <models root>`: paths are relative to that root
    root = seed.get("root", "").rstrip("/")
    rel = directory[len(root) + 1:] if root and directory.startswith(root + "/") else directory
    seed_host = seed["host"]
    src = f"{seed.get('user', 'root')}@{seed_host}:{rel}/"
    # weights_peer_bwlimit: a bound per copy, so the source (maybe serving) keeps its bandwidth
    bw = f" --bwlimit={q(str(seed['bwlimit']))}" if seed.get("bwlimit") else ""
    # --timeout: give up when no byte moves for 120 s (a copy of 232 GB has no total bound).
    # -rt, not -a: regular files, directories and times only. The peer may be compromised, and what
    # it sends lands as root in a directory that vLLM and the weights check read: a link (-l) could
    # point anywhere (the checks never follow one, but nothing else should meet one either), a
    # device or FIFO (-D) is no weight, and owners and modes (-o -g -p) would carry a setuid bit. A
    # weights directory needs none of them: `hf download --local-dir` writes regular files (its
    # .cache/huggingface holds metadata files, no links), and the link_from copy hard-links on this
    # host. rsync skips what it does not copy ("skipping non-regular file"), and a link left at the
    # destination is never followed into (a directory the peer sends replaces it).
    copy = (f"rsync -rt --partial --timeout=120{bw} --delete --exclude=.nemofleet-complete "
            f"--exclude={q('/' + WAITING)} -e {q(ssh)} {q(src)} {q(directory + '/')}")
    seeded = shell.say(f"seeded {directory} from {seed_host}", err=False)
    failed = shell.say(f"seeding from {seed_host} failed; trying the next source, then the Hugging Face mirror")
    if seed.get("held"):
        # asked only whether it holds a verified copy now (its completion marker): never waited for
        lines = [f"ok=0; rsync --timeout=60 --list-only -e {q(ssh)} {q(src + MARKER)} >/dev/null 2>&1 && ok=1; "
                 f"[ $ok = 1 ] || {shell.say(f'{seed_host} holds no verified copy now: not copied from', err=False)}",
                 f"if [ $ok = 1 ]; then if {copy}; then {seeded}; else {failed}; fi; fi"]
    else:
        lines = [*(_wait_lines(seed, ssh, src, directory) if seed.get("wait") else ["ok=1"]),
                 f"if [ $ok = 1 ] && {copy}; then {seeded}; else {failed}; fi"]
    return [
        *lines,
        # the peer's files count only when they are complete AND of this commit (HF metadata)
        f"if {verified}; then echo 'peer copy is verified: no download needed'; exit 0; fi",
    ]


WAITING = ".cache/nemofleet-waiting"  # touched while this host waits for its own source


def _wait_lines(seed: dict, ssh: str, src: str, directory: str) -> list[str]:
    """A fan-out source of the same run may still be fetching (docs/fanout.md): wait until its
    completion marker is there (it verified its copy), as long as its directory changes (files
    growing, or its own heartbeat while it waits for its source in turn); after `wait` s without
    a change (a source that failed, hangs or is down) it is skipped. With `start` (a plain
    converge, where every host runs this operation at the same moment), a source whose directory
    could not be listed at all for `start` s never began (refused, failed before, unreachable)
    and is skipped then. The heartbeat lives under .cache, which the weights check does not
    count, and is never copied."""
    q = shell.quote
    stall = int(seed["wait"])
    beat = q(f"{directory}/{WAITING}")
    peer = seed["host"]
    gone = f"source {peer} has no verified copy and made no progress for {stall} s"
    never = ""
    if seed.get("start"):
        start = int(seed["start"])
        late = f"source {peer} did not begin fetching within {start} s (refused, failed before or unreachable)"
        never = f"if [ $seen = 0 ] && [ $waited -ge {start} ]; then ok=0; {shell.say(late)}; break; fi; "
    # polled after 1, 2, 4, 8 s, then every 10 s: a small model's source is done in seconds, a large
    # one's is asked every 10 s (two listings over SSH each time)
    return [
        f"ok=1; last=; idle=0; seen=0; waited=0; d=1; slept=0; mkdir -p {q(directory + '/.cache')}; "
        f"while ! rsync --timeout=60 --list-only -e {q(ssh)} {q(src + MARKER)} >/dev/null 2>&1; do touch {beat}; "
        f"now=$(rsync --timeout=60 -r --list-only -e {q(ssh)} {q(src)} 2>/dev/null) && seen=1; "
        "now=$(printf %s \"$now\" | cksum); "
        "if [ \"$now\" != \"$last\" ]; then last=$now; idle=0; else idle=$((idle + slept)); fi; "
        f"if [ $idle -ge {stall} ]; then ok=0; "
        f"{shell.say(gone)}; "
        f"break; fi; {never}sleep $d; waited=$((waited + d)); slept=$d; "
        f"if [ $d -lt 10 ]; then d=$((d * 2)); fi; if [ $d -gt 10 ]; then d=10; fi; done; rm -f {beat}",
    ]


def link_script(source: str, directory: str, revision: str) -> str:
    """Hard-link a copy of `source` to `directory` (no extra disk; huggingface_hub replaces a file
    it downloads, so the source keeps its own; its metadata, which it rewrites in place, is copied),
    without the completion marker. A linked file that
    fails the offline check (edited in place since) is unlinked again, so `hf download` fetches it."""
    q = shell.quote
    tmp = directory + ".nemofleet-link"
    # huggingface_hub rewrites its metadata files in place: those are copied, never linked
    return (f"if [ ! -e {q(directory)} ]; then rm -rf {q(tmp)}; cp -al {q(source)} {q(tmp)} && "
            f"rm -rf {q(tmp + '/.cache')} && {{ [ ! -d {q(source + '/.cache')} ] || cp -a {q(source + '/.cache')} {q(tmp + '/.cache')}; }} && "
            f"find {q(tmp + '/.cache')} -name '*.lock' -delete 2>/dev/null; "
            f"rm -f {q(tmp + '/' + MARKER)} && mv {q(tmp)} {q(directory)} && "
            f"{{ {check_command(directory, revision, 'clean')} >/dev/null 2>&1; }}; fi")


def download_script(repo, revision, directory, image, endpoint, token_file, files, cleanup, present_bytes,
                    seed: dict | None = None, link_from: str | None = None) -> str:
    unit = DOWNLOAD_PREFIX + slug(directory)
    q = shell.quote
    envs = ["-e", "HF_HUB_DISABLE_TELEMETRY=1", "-e", "HF_XET_HIGH_PERFORMANCE=1"]
    if endpoint:
        envs += ["-e", f"HF_ENDPOINT={endpoint}"]
    run = ["systemd-run", f"--unit={unit}", "--collect", "--wait", "--quiet",
           "--property=TimeoutStartSec=infinity", "docker", "run", "--rm", "--pull=never", f"--name={unit}", "--network=host"]
    if token_file:
        run += [f"--env-file={token_file}"]
    run += envs + ["-v", f"{directory}:/download", "--entrypoint", "hf", image, "download", repo, *files,
                   "--revision", revision, "--local-dir", "/download"]
    stalled = f"/run/{unit}.stalled"
    lines = [
        "set -e",
        STALL_GUARD,
        # a download from an earlier run may still be going (it survives SSH): wait for it while it
        # makes progress; one stalled for STALL_SECONDS is stopped (this run resumes its files)
        shell.join(["stall_guard", unit, directory, STALL_SECONDS]) + " || true",
        *([link_script(link_from, directory, revision)] if link_from else []),
        f"mkdir -p {q(directory)}",
        *(seed_lines(seed, directory, revision) if seed else []),
        precheck_command(directory, repo, revision, endpoint, token_file, present_bytes) + " >/dev/null",
        # orphaned *.incomplete files of killed downloads are never reused (huggingface_hub writes a new one per process)
        f"find {q(directory + '/.cache/huggingface/download')} -name '*.incomplete' -delete 2>/dev/null || true",
    ]
    for rel in cleanup:
        lines.append(f"rm -f {q(directory + '/' + rel)} {q(directory + '/.cache/huggingface/download/' + rel + '.metadata')}")
    lines += [
        shell.join(["rm", "-f", stalled]),
        # the watchdog: no fd of this SSH session stays open in it, so the command ends with the download
        "{ sleep 10; " + shell.join(["stall_guard", unit, directory, STALL_SECONDS]) + " || "
        + shell.join(["touch", stalled]) + "; } </dev/null >/dev/null 2>&1 & guard=$!",
        "rc=0; " + shell.join(run) + " || rc=$?",
        "kill $guard 2>/dev/null || true",
        "if [ -e " + shell.quote(stalled) + " ]; then rm -f " + shell.quote(stalled) + "; "
        + shell.say(f"hf download of {repo}@{revision} made no progress for {STALL_SECONDS} s and was stopped; "
                    f"run again to resume it") + "; fi",
        "[ $rc -eq 0 ] || { " + shell.join(["journalctl", "-u", unit, "-n", "15", "--no-pager", "-o", "cat"])
        + " >&2; " + shell.fail(f"hf download of {repo}@{revision} failed (log above); the weights in {directory} "
                                 "were left as they are") + "; }",
    ]
    return "\n".join(lines)


def model_reads(directory: str, revision: str, full_verify: bool) -> tuple:
    """The fact model() reads (deploy.py reads it ahead)."""
    return WeightsStatus, {"directory": directory, "revision": revision, "full": full_verify}


@reads_with(lambda directory, revision, full_verify=False, **_: model_reads(directory, revision, full_verify))
@operation(is_idempotent=True)
def model(repo: str, revision: str, directory: str, image: str, endpoint: str | None = None,
          token_file: str | None = None, full_verify: bool = False, seed: dict | None = None,
          link_from: tuple[str, str] | None = None, parts: list | None = None):
    """Weights of repo@revision complete in `directory` (completion marker written last).

    The marker names the revision it was written for, and files copied in (from a peer, by hand,
    or hard-linked from another commit's directory) count only when huggingface_hub's metadata says
    they are of this commit: a new revision always reaches the Hub (or its mirror). `link_from`:
    (directory, commit) of a complete copy of the same repo whose files are hard-linked in first,
    so `hf download` fetches only what changed between the two commits (nothing for the same one).
    `parts`: [(file, its bytes, SHA-256)] from a signed bundle, placed instead of any download."""
    status = fact(*model_reads(directory, revision, full_verify))
    if status and status["complete"] and status["marker"]:
        host.noop(f"{repo}@{revision[:12]} is complete in {directory}")
        return
    pinned = is_commit(revision)
    if status and status["complete"] and (status.get("commit_ok") or not pinned):
        # complete but unmarked (seeded from a peer, or downloaded by hand): verify and mark only
        yield check_command(directory, revision, "write")
        return
    if parts is not None:
        if any(rel.startswith("/") or ".." in rel.split("/") for rel, _, _ in parts):
            yield fail_command("the bundle names a weights file outside its directory: refused")
            return
        if seed:  # a fan-out target (docs/fanout.md): from a peer of this run, the bundle only if none had it
            yield StringCommand("sh", "-c", shell.quote("\n".join(
                [f"mkdir -p {shell.quote(directory)}", *seed_lines(seed, directory, revision)])))
        # the first host of the run received them before any change (bundle_received)
        yield FunctionCommand(bundle_unless_seeded, (directory, revision, parts), {})
        yield check_command(directory, revision, "write")
        return
    files: list[str] = []
    cleanup: list[str] = []
    if status and status["exists"] and "model.safetensors.index.json" not in status["missing"] \
            and not any(m.startswith("tokenizer") for m in status["missing"]) and not status.get("other_commits"):
        files = sorted(set(status["missing"]) | set(status["truncated"]))
        cleanup = sorted(status["truncated"])
    linked = link_from[0] if link_from and not (status and status["exists"]) else None
    yield StringCommand("sh", "-c", shell.quote(download_script(
        repo, revision, directory, image, endpoint, token_file, files, cleanup,
        (status or {}).get("present_bytes", 0), seed=seed, link_from=linked)))
    yield check_command(directory, revision, "write")


BUNDLE_SUMS = ".cache/nemofleet-bundle.sha256"


def from_bundle(directory: str, parts: list):
    """Each file of the weights from the bundle into `directory`, then every one checked on the
    host against its SHA-256 in the signed manifest (the weights check then writes the marker);
    a directory that fails it is removed."""
    yield cmd("mkdir", "-p", "--", *sorted({os.path.dirname(f"{directory}/{rel}") for rel, _, _ in parts}))
    for rel, src, _ in parts:
        yield FileUploadCommand(src, f"{directory}/{rel}")
    sums = "".join(f"{sha}  {rel}\n" for rel, _, sha in parts).encode()
    yield FileUploadCommand(io.BytesIO(sums), f"{directory}/{BUNDLE_SUMS}")
    q = shell.quote
    yield StringCommand("sh", "-c", q(
        f"cd {q(directory)} && timeout 3600 sha256sum -c --quiet {BUNDLE_SUMS} >/dev/null 2>&1; rc=$?; "
        f"rm -f {BUNDLE_SUMS}; [ $rc -eq 0 ] || {{ rm -rf -- {q(directory)}; "
        + shell.fail(f"the weights from the bundle arrived changed in {directory}: a file's SHA-256 does not match "
                     "the signed manifest") + "; }"))


def _run(host, commands) -> str | None:
    """Run FileUploadCommands and StringCommands on `host` now; None, or why one failed."""
    for c in commands:
        if isinstance(c, FileUploadCommand):
            ok, out = host.put_file(c.src, c.dest), None
        else:
            ok, out = host.run_shell_command(c)
        if not ok:
            return ((out.stderr if out is not None else "") or "").strip() or "an upload from the controller failed"
    return None


def unless_verified(host, verified: str, commands) -> bool:
    """At execution time: `commands` (a bundle's files from the controller) only when the shell
    condition `verified` fails, i.e. no peer's copy (and no earlier receipt) left them here, so a
    fleet's parts cross the controller's link once, not once per host."""
    ok, _ = host.run_shell_command(StringCommand("sh", "-c", shell.quote(verified)))
    why = None if ok else _run(host, commands)
    if why:
        host.log(why, logger.error)
    return why is None


def bundle_unless_seeded(state, host, directory: str, revision: str, parts: list) -> bool:
    """The bundle's weights (from_bundle) only when neither a peer's copy nor the run's first
    receipt (bundle_received) left them complete and of this commit."""
    return unless_verified(host, weights_ok(directory, revision), from_bundle(directory, parts))


# a host waiting for the first host's verdict on a part asks again after this many seconds
VERDICT_POLL = 0.5


@operation(is_idempotent=False)
def bundle_received(staging, units: list):
    """The image and the weights a run takes from a signed bundle, before anything else changes:
    each `units` entry (key, [(part, its SHA-256)], commands that place and check it on the host,
    cleanup when refused) is received by the first host of the run that takes it (its bytes hashed
    on the controller as they are uploaded, and on the host), and every other host that takes it
    waits for that verdict: a changed byte refuses every host before anything changes."""
    yield FunctionCommand(_receive, (staging, units), {})


def _receive(state, host, staging, units) -> bool:
    """Receive the `units` this host is the first to take, then wait for the verdict on every part
    of the run (its own first), so a changed byte stops each host before it changes anything."""
    op, placed, mine, late = host.current_op_hash, [], {u[0]: u for u in units}, set[str]()
    staging.started.add(host.name)
    for key in [*mine, *(k for k in list(staging.takers) if k not in mine)]:
        waited = 0.0
        while key not in staging.verdicts:
            active = [h for h in state.inventory if h in state.active_hosts]  # in the inventory's order
            gone = late | {h.name for h in active if h.name != host.name and op in state.ops.get(h, {})
                           and state.ops[h][op].operation_meta.is_complete()}
            first = staging.first(key, [h.name for h in active], gone)
            if first is None:  # every host that takes it is gone: no verdict will come
                break
            if first != host.name:
                time.sleep(VERDICT_POLL)  # gevent's, under pyinfra: the other hosts run meanwhile
                waited += VERDICT_POLL
                if waited > fanout.SOURCE_START and first not in staging.started:
                    late.add(first)  # never began (no slot in pyinfra's pool, while this host holds one)
                continue
            _, parts, commands, cleanup = mine[key]
            placed.append(cleanup)
            why = _run(host, commands)
            bad = [name for part, sha, name in parts if part.sha256() not in (None, sha)]
            if bad:  # hashed on the controller as it was read for the upload: the bundle itself is changed
                why = (f"the bundle's part {bad[0]} does not match its SHA-256 in the signed manifest (a changed or "
                       "damaged byte): refused")
            staging.verdicts[key] = (host.name, why)
        first, why = staging.verdicts.get(key, (None, None))
        if why:  # what this host received is removed again: nothing changed here
            if placed:
                host.run_shell_command(StringCommand("sh", "-c", shell.quote("; ".join(placed))))
            host.log(why if first == host.name else f"{why} (on {first}, the first host of this run that takes it; "
                     "nothing changed here)", logger.error)
            return False
    return True


@operation(is_idempotent=True)
def pruned(directories: list[str]):
    """Remove weights directories no release on this host uses any more (gate nothing: an
    empty list changes nothing)."""
    if not directories:
        host.noop("no unused weights directory")
        return
    for d in directories:
        # desired.unused_weights names only directories of our own host_dir_name shape; the path
        # is still one quoted word, after `--`
        yield cmd("rm", "-rf", "--one-file-system", "--", d)
