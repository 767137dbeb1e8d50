"""Every path and marker nemofleet uses on a host, named once."""

from __future__ import annotations

UNIT_DIR = "/etc/systemd/system"
UNIT_PREFIX = "nemofleet-vllm-"
UNIT_GLOB = f"{UNIT_DIR}/{UNIT_PREFIX}*.service"

ETC = "/etc/nemofleet"
VLLM_ENV = f"{ETC}/vllm.env"  # VLLM_API_KEY for the containers (0600)
API_AUTH = f"{ETC}/api-auth.header"  # curl -H @file for health checks (0600)
HF_ENV = f"{ETC}/hf.env"  # HF_TOKEN for downloads (0600)
HEALTH_CONF = f"{ETC}/health.conf"  # webhook URL and other health knobs (0600)
HEALTH_CONFIG = f"{ETC}/health.json"  # what the health program checks on this host (render.health_config)
SEED_KEY = f"{ETC}/seed_ed25519"
SEED_KNOWN_HOSTS = f"{ETC}/seed_known_hosts"
ROOT_AUTHORIZED_KEYS = "/root/.ssh/authorized_keys"  # where the restricted fleet seed key is authorised

STATE_DIR = "/var/lib/nemofleet"
RELEASE = f"{STATE_DIR}/release"
PREVIOUS = f"{STATE_DIR}/previous"  # the release being replaced (units + record), for rollback
AUDIT_LOG = f"{STATE_DIR}/audit.log"
LOCK = f"{STATE_DIR}/lock"
GPU_ACCESS = f"{STATE_DIR}/gpu-access"
HEALTH_STATE = f"{STATE_DIR}/health"

COMPILE_CACHE = "/var/cache/nemofleet/vllm"
DOCKER_PROXY = f"{UNIT_DIR}/docker.service.d/nemofleet-proxy.conf"
DEV_CHAR_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
DAEMON_JSON = "/etc/docker/daemon.json"
HEALTH_SCRIPT = "/usr/local/bin/nemofleet-health"
HEALTH_CRON = "/etc/cron.d/nemofleet-health"
HEALTH_LOCK = "/run/lock/nemofleet-health.lock"
WEIGHTS_MARKER = ".nemofleet-complete"

# the front door (HAProxy from the distribution's package; docs/front-door.md)
FRONT_DOOR_CFG = "/etc/haproxy/haproxy.cfg"
FRONT_DOOR_KEYS = f"{ETC}/front-door.keys"  # "Bearer <key>" patterns HAProxy reads at load (0600)
FRONT_DOOR_SOCKET = "/run/haproxy/nemofleet-admin.sock"  # runtime API, root only
FRONT_DOOR_DROPIN = f"{UNIT_DIR}/haproxy.service.d/nemofleet.conf"
FRONT_DOOR_BACKEND = "vllm"
DRAIN_SCRIPT = "/usr/local/bin/nemofleet-drain"  # take an instance out of the front door, restart, put back


def unit_path(instance: str) -> str:
    return f"{UNIT_DIR}/{UNIT_PREFIX}{instance}.service"
