"""The shell commands the fleet layer runs on a host, as pure functions (no I/O).

Like Kamal's lib/kamal/commands/*.rb: every remote step is a string built here, golden-tested
with exact strings and run with `bash` against a temporary state directory
(tests/unit/test_fleet_commands.py). Scripts are POSIX sh (the host's /bin/sh may be dash),
print `key=value` lines the controller parses (see `nemofleet.lockinfo.parse`), and
bound every wait they contain (`flock -w`, `timeout`).

Lock layout: `paths.LOCK` is a directory that appears with its info file in one atomic rename
(whoever renames theirs into place holds the lock; see lock_acquire); `LOCK/info` holds `holder=`, `token_sha256=`, `since=`, `expires=` (Unix time) and
`message=`. Only the SHA-256 of the holder's token is stored: reading the info file (lock status,
the deploy's DeployLock fact) never reveals a token that would release the lock.
"""

from __future__ import annotations

import hashlib
import re
from . import shell  # the one quoting boundary

from . import paths, remote

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def one_line(text: str) -> str:
    """Free text (a lock message, an audit detail) as one printable line: a newline in it would
    forge a key of the info file or a line of the audit log."""
    return _CONTROL.sub(" ", text).strip()


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_LOCK_VARS = f"s={paths.STATE_DIR}; d={paths.LOCK}; now=$(date +%s)"


def _show_info(prefix: str = "") -> str:
    """Print the info file's lines (prefixed), or a marker when it is missing or unreadable."""
    sed = f"sed 's/^/{prefix}/' \"$d/info\"" if prefix else "cat \"$d/info\""
    return f"if [ -r \"$d/info\" ]; then {sed}; else echo {prefix}holder=unknown; fi"


# a lock dir without a readable expiry (an older nemofleet that died between its `mkdir` and its
# info file) expires this long after it was made (its mtime): the default TTL of nemofleet.fleet.lock
NO_INFO_TTL = 2 * 3600

# `expiry DIR`: the expires= of DIR/info, or DIR's mtime + NO_INFO_TTL when it has none
_EXPIRY = ("expiry() { e=$(sed -n 's/^expires=//p' \"$1/info\" 2>/dev/null); "
           "case $e in ''|*[!0-9]*) e=$(( $(stat -c %Y \"$1\" 2>/dev/null || echo 0) + " + str(NO_INFO_TTL) + " ));; "
           "esac; echo \"$e\"; }")


def lock_acquire(holder: str, token: str, ttl: int, message: str) -> str:
    """Take the deploy lock. Prints `state=ACQUIRED` (ours now), `state=OWNED` (already held with
    this token: a rollout run under `nemofleet lock acquire`'s token) or `state=HELD` and the
    holder's info.

    The lock appears in one atomic step: its info file is written into a fresh temporary
    directory, which is then renamed onto `paths.LOCK` (`mv -T`: rename(2), which fails while
    the lock exists with its info; the `[ ! -e ]` before it keeps an empty lock directory an older
    nemofleet may have just made from being replaced). A controller killed at any point leaves either no lock or a
    lock with its expiry, never a lock without one (a leftover temporary directory is not the
    lock, and is removed an hour later by the next acquire).

    An expired lock is taken over first (`expired_*=` lines name the old holder); the takeover
    renames the old directory away and re-checks that it moved the expired lock (not a fresh one
    taken meanwhile by another controller), else puts it back. A lock without info (made by an
    older nemofleet) expires NO_INFO_TTL after it was made."""
    digest = token_digest(token)
    fields = "holder=%s\\ntoken_sha256=%s\\nsince=%s\\nexpires=%s\\nmessage=%s\\n"
    write = (f"printf '{fields}' {shell.quote(one_line(holder))} {digest} \"$(date -u +%FT%TZ)\" "
             f"\"$((now + {int(ttl)}))\" {shell.quote(one_line(message))}")
    return (
        f"{_LOCK_VARS}; mkdir -p \"$s\"\n"
        f"if [ \"$(sed -n 's/^token_sha256=//p' \"$d/info\" 2>/dev/null)\" = {digest} ]; then "
        "echo state=OWNED; echo now=$now; exit 0; fi\n"
        "find \"$s\" -maxdepth 1 -name 'lock.*.*' -mmin +60 -exec rm -rf {} + 2>/dev/null\n"
        f"{_EXPIRY}\n"
        "if [ -d \"$d\" ] && exp=$(expiry \"$d\") && [ \"$exp\" -le \"$now\" ]; then\n"
        "  t=\"$d.expired.$$\"\n"
        "  if mv -T \"$d\" \"$t\" 2>/dev/null; then\n"
        "    if [ \"$(expiry \"$t\")\" = \"$exp\" ]; then\n"
        "      if [ -r \"$t/info\" ]; then sed 's/^/expired_/' \"$t/info\"; else echo expired_holder=unknown; fi\n"
        "      rm -rf \"$t\"\n"
        "    else mv -T \"$t\" \"$d\" 2>/dev/null || true; fi\n"
        "  fi\n"
        "fi\n"
        "n=\"$d.new.$$\"; rm -rf \"$n\"\n"
        f"if mkdir \"$n\" && {write} > \"$n/info\" && [ ! -e \"$d\" ] && mv -T \"$n\" \"$d\" 2>/dev/null; then echo state=ACQUIRED\n"
        f"else rm -rf \"$n\"; echo state=HELD; {_show_info()}; fi\n"
        "echo now=$now\n")


def lock_release(token: str | None, force: bool = False) -> str:
    """Release the lock: only with the holder's token, or `force` (a lock whose holder is gone).
    Prints `state=RELEASED` (with the released holder's info when forced), `state=FREE` (no lock)
    or `state=NOT_HOLDER` and the holder's info."""
    digest = token_digest(token) if token else "-"
    allowed = "true" if force else f"[ \"$(sed -n 's/^token_sha256=//p' \"$d/info\" 2>/dev/null)\" = {digest} ]"
    shown = f"{_show_info('released_')}; " if force else ""
    return (
        f"{_LOCK_VARS}\n"
        "if [ ! -d \"$d\" ]; then echo state=FREE; exit 0; fi\n"
        f"if {allowed}; then\n"
        f"  {shown}t=\"$d.released.$$\"; mv \"$d\" \"$t\" && rm -rf \"$t\" && echo state=RELEASED\n"
        f"else echo state=NOT_HOLDER; {_show_info()}; fi\n")


def lock_refresh(token: str, ttl: int) -> str:
    """Push the holder's expiry to now + ttl (a rollout does this before every batch, so a long
    rollout is not taken over). Prints `state=REFRESHED`, or `state=LOST` and the info of
    whoever holds it now (ours expired and was taken over, or was force-released)."""
    digest = token_digest(token)
    return (
        f"{_LOCK_VARS}\n"
        f"if [ \"$(sed -n 's/^token_sha256=//p' \"$d/info\" 2>/dev/null)\" = {digest} ]; then\n"
        f"  sed \"s/^expires=.*/expires=$((now + {int(ttl)}))/\" \"$d/info\" > \"$d/info.tmp\" "
        "&& mv \"$d/info.tmp\" \"$d/info\" && echo state=REFRESHED\n"
        "elif [ -d \"$d\" ]; then echo state=LOST; " + _show_info() + "\n"
        "else echo state=LOST; fi\n")


def lock_status() -> str:
    """Read the lock: `state=FREE`, or `state=HELD` and its info; `now=` is the host's clock (an
    expiry is judged against the host that wrote it). Always exits 0 (the DeployLock fact)."""
    return (f"{_LOCK_VARS}\n"
            f"if [ -d \"$d\" ]; then echo state=HELD; {_show_info()}; else echo state=FREE; fi\n"
            "echo now=$now\n")


def release_read() -> str:
    """The release record (`id=`, `image=`, ...) and a digest of the unit files: a rollout compares
    both before and after the deploy to know whether it touched the host at all."""
    return (f"cat {paths.RELEASE} 2>/dev/null; "
            f"printf 'units_sha256=%s\\n' \"$(cat {paths.UNIT_GLOB} 2>/dev/null | sha256sum | cut -c1-16)\"")


def keep_previous() -> str:
    """Keep the release being replaced (units + record) so a rollback can return to it."""
    d = paths.PREVIOUS
    return (f"set -e; d={d}; rm -rf $d.new; mkdir -p $d.new; "
            f"cp {paths.UNIT_GLOB} $d.new/ 2>/dev/null || true; "
            f"cp {paths.RELEASE} $d.new/release; rm -rf $d; mv $d.new $d")


def rollback(expect: str | None = None, ready_timeout: int = 60) -> str:
    """Put the kept release back: its units replace the current ones (units it does not have are
    stopped and removed), its record becomes the release. With `expect`, refuse unless the kept
    release is that id: a rollout rolls a host back only to the release it replaced on it.
    On a host with a front door the instances restart one at a time through it (drained, restarted,
    ready within `ready_timeout`, back in), so the host keeps serving; one that is not ready in time
    is left to the front door's health checks (and the health cron puts it back), never blocking the
    others. Without a front door they restart at once."""
    p, unit_dir = paths.PREVIOUS, paths.UNIT_DIR
    guard = (f"k=$(sed -n 's/^id=//p' $p/release)\n"
             f"[ \"$k\" = {shell.quote(expect)} ] || {{ printf 'the kept release is %s, not %s: not rolling back\\n' "
             f"\"$k\" {shell.quote(expect)} >&2; exit 1; }}\n"
             if expect else "")
    return (
        "set -e\n"
        f"p={p}\n"
        "[ -f $p/release ] || { echo 'no previous release kept on this host' >&2; exit 1; }\n"
        f"{guard}"
        f"for u in {paths.UNIT_GLOB}; do\n"
        # names read from the unit directory: always quoted, after --
        "  [ -e \"$u\" ] || continue; n=$(basename -- \"$u\")\n"
        "  if [ ! -e \"$p/$n\" ]; then timeout 300 systemctl disable --now -- \"$n\"; rm -f -- \"$u\"; fi\n"
        "done\n"
        f"cp $p/{paths.UNIT_PREFIX}*.service {unit_dir}/\n"
        f"cp {paths.RELEASE} {paths.RELEASE}.rolled-back 2>/dev/null || true\n"
        f"cp $p/release {paths.RELEASE}\n"
        "timeout 120 systemctl daemon-reload\n"
        f"for u in $p/{paths.UNIT_PREFIX}*.service; do n=$(basename -- \"$u\"); i=${{n#{paths.UNIT_PREFIX}}}; i=${{i%.service}}\n"
        "  timeout 60 systemctl enable -q -- \"$n\"\n"
        f"  if [ -x {paths.DRAIN_SCRIPT} ] && systemctl is-active -q haproxy && {paths.DRAIN_SCRIPT} state \"$i\" >/dev/null 2>&1; then\n"
        f"    READY_TIMEOUT={int(ready_timeout)} timeout {int(ready_timeout) + 120} flock -w 60 {paths.HEALTH_LOCK} "
        f"{paths.DRAIN_SCRIPT} restart \"$i\" || echo \"instance $i: not ready through the front door yet\"\n"
        "  else timeout 60 systemctl restart --no-block -- \"$n\"; fi\n"
        "done\n"
        f"echo \"rolled back to $(sed -n 's/^id=//p' {paths.RELEASE})\"\n")


def audit_command(operator: str, event: str, detail: str) -> str:
    """One line appended to the host's audit log: `<UTC time> <operator> <event> <detail>`.
    The only audit writer (rollout, rollback, rebuild, and the deploy's release change)."""
    line = one_line(f"{operator} {event} {detail}")
    return (f"mkdir -p {paths.STATE_DIR} && printf '%s %s\\n' \"$(date -u +%FT%TZ)\" {shell.quote(line)} "
            f">> {paths.AUDIT_LOG}")


def gate() -> str:
    """One readiness check of every instance: the health script the deploy installed (/health
    200, the model listed, the optional probe), serialised with its cron runs by the same lock.
    FAIL_RESTART=0: the gate only looks; it never self-heal-restarts an instance it waits for."""
    return f"FAIL_RESTART=0 timeout 180 flock -w 60 {paths.HEALTH_LOCK} {paths.HEALTH_SCRIPT}"


def gpu_returns(returning: dict[str, list[str]], front_door: bool) -> list[str]:
    """Per GPU the health script drained that the plan serves on again (gpuhealth.returning): its
    marker removed and its instances back in the front door, under the health script's lock."""
    out = []
    for uuid, names in returning.items():
        marks = [f"{paths.HEALTH_STATE}/gpu-{uuid}.sick", f"{paths.HEALTH_STATE}/gpu-{uuid}.healthy_runs"]
        marks += [f"{paths.HEALTH_STATE}/{n}.gpu_sick" for n in names]
        steps = [shell.join(["rm", "-f", *marks])]
        if front_door:
            steps += [f"{{ ! systemctl is-active -q haproxy || {shell.join([paths.DRAIN_SCRIPT, 'in', n])}; }}"
                      for n in names]
        out.append(f"flock -w 900 {paths.HEALTH_LOCK} sh -c {shell.quote(' && '.join(steps))}")
    return out


def status(models_root: str, prom_dir: str) -> str:
    """What `nemofleet status` shows of a host: release record, units (state and description,
    which names the GPUs and model), health metrics, weights on disk, downloads in progress."""
    root, prom = shell.quote(models_root.rstrip("/")), shell.quote(f"{prom_dir.rstrip('/')}/nemofleet.prom")
    return (
        f"sed 's/^/release /' {paths.RELEASE} 2>/dev/null\n"
        f"for u in {paths.UNIT_GLOB}; do [ -e \"$u\" ] || continue; n=$(basename -- \"$u\")\n"
        "  echo \"unit $n $(timeout 10 systemctl is-active -- \"$n\") $(sed -n 's/^Description=//p' \"$u\")\"; done\n"
        f"grep -v '^#' {prom} 2>/dev/null | sed 's/^/prom /'\n"
        f"for m in {paths.HEALTH_STATE}/gpu-*.sick; do [ -f \"$m\" ] && head -n 1 \"$m\" | sed 's/^/gpusick /'; done\n"
        f"for d in {root}/*/; do [ -d \"$d\" ] || continue; n=$(basename \"$d\")\n"
        # like with like: the index's total_size counts tensor bytes, so the shards on disk are
        # counted without their headers (a safetensors file: 8-byte length, JSON header, tensors)
        f"  have=$(timeout 60 {shell.join(remote.PYTHON[:3])} -c {shell.quote(remote.source('tensor_bytes'))} \"$d\" 2>/dev/null || echo '? of ?')\n"
        "  echo \"weights $n $have tensor bytes, "
        f"$([ -f \"$d/{paths.WEIGHTS_MARKER}\" ] && echo complete || echo incomplete)\"; done\n"
        "for u in $(timeout 10 systemctl list-units --no-legend --plain 'nemofleet-weights-*' 2>/dev/null | awk '{print $1}'); do\n"
        "  echo \"download $u $(timeout 10 systemctl is-active $u): "
        "$(timeout 10 journalctl -u $u -n 1 --no-pager -o cat 2>/dev/null | tr '\\r' '\\n' | tail -1)\"; done\n"
        "true\n")
