"""Probe that containers keep their GPUs across `systemctl daemon-reload`.

The NVML "Unknown Error" trap (NVIDIA/nvidia-docker#1730, docs/recipes.md) is judged from facts
by the plan; this checks it for real, the way NVIDIA's troubleshooting notes test a fix: start a test
container with the GPU the way the units get theirs, `systemctl daemon-reload`, then
`nvidia-smi` in that container must still work. It runs before any vLLM unit (re)starts, and
only when what decides GPU access changed (the signature, kept in STATE once the probe passed),
so a converged host is not probed again.
"""

from __future__ import annotations

from .. import shell  # the one quoting boundary

from pyinfra import host
from pyinfra.api import StringCommand, operation

from ..paths import GPU_ACCESS as STATE, STATE_DIR
# daemon.json keys that decide how containers get their GPUs (and so whether the trap applies)
GPU_ACCESS_KEYS = ("exec-opts", "runtimes", "default-runtime", "features")
CONTAINER = "nemofleet-gpu-probe"
# each step is bounded: nvidia-smi in a container that lost its GPU can hang like on the host
START_TIMEOUT, SMI_TIMEOUT = 120, 30


def probe_script(image: str, gpu_args: list[str], signature: str, remedy_hint: str) -> str:
    q = shell.quote
    run = ["docker", "run", "-d", "--rm", f"--name={CONTAINER}", "--pull=never", "--network=none",
           *gpu_args, "--entrypoint", "sleep", image, "600"]
    lines = [
        "set -u",
        "fail() { docker rm -f " + CONTAINER + " >/dev/null 2>&1; printf '%s\\n' \"$1\" >&2; exit 1; }",
        f"docker rm -f {CONTAINER} >/dev/null 2>&1",
        f"out=$(timeout {START_TIMEOUT} {' '.join(q(w) for w in run)} 2>&1) || "
        "fail \"a test container with the GPU could not start: $out\"",
        f"before=$(timeout {SMI_TIMEOUT} docker exec {CONTAINER} nvidia-smi -L 2>&1) || "
        "fail \"nvidia-smi fails in a test container with the GPU: $before\"",
        # bounded by systemctl itself (its reload call to PID 1 gives up after
        # DAEMON_RELOAD_TIMEOUT_SEC, 10 min); a timeout(1) here would leave systemd mid-reload
        "systemctl daemon-reload",
        f"after=$(timeout {SMI_TIMEOUT} docker exec {CONTAINER} nvidia-smi -L 2>&1) || fail \"the GPU probe failed: a running container "
        f"lost its GPU after systemctl daemon-reload ($after); {remedy_hint}\"",
        f"docker rm -f {CONTAINER} >/dev/null 2>&1",
        "[ \"$before\" = \"$after\" ] || fail \"the GPU probe failed: a running container saw other GPUs after "
        "systemctl daemon-reload ($before -> $after)\"",
        "echo \"GPU access survives daemon-reload: $after\"",
        f"mkdir -p {STATE_DIR} && printf '%s\\n' {q(signature)} > {STATE}",
    ]
    return "\n".join(lines)


@operation(is_idempotent=True)
def survives_daemon_reload(image: str, gpu_args: list[str], signature: str, remedy_hint: str,
                           recorded: str | None, force: bool | set = False):
    """A running container keeps its GPU across daemon-reload; probed when `signature` (what
    decides GPU access) differs from the one that last passed, or when `force` is true or a
    set holding one of GPU_ACCESS_KEYS (the daemon.json keys this run changed, filled in by an
    earlier op as it executed). `recorded`: the signature on the host (GpuAccessRecord, read
    with HostFacts, which saves a command per host; only this op writes it)."""
    if isinstance(force, set):
        force = bool(force & set(GPU_ACCESS_KEYS))
    if not force and recorded == signature:
        host.noop("GPU access was probed for this setup")
        return
    yield StringCommand("sh", "-c", shell.quote(probe_script(image, gpu_args, signature, remedy_hint)))
