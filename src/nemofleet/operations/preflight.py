"""The preflight verdict: fail a host that cannot serve, before anything changes."""

from pyinfra import host, logger
from pyinfra.api import operation

from . import fail_command

# warnings already said in this run ({text: first host}): a fleet-wide one (e.g. the NVFP4 note) is
# said in full once, then each other host it applies to gets a one-line pointer to it
_SAID: dict[str, str] = {}


@operation(is_idempotent=True)
def verdict(refusals: list[str], warnings: list[str] | None = None):
    """Fail this host with one sentence per refusal; log warnings; otherwise change nothing."""
    for w in warnings or []:
        first = _SAID.setdefault(w, host.name)
        if first == host.name or len(w) <= 80:
            host.log(f"preflight warning: {w}", logger.warning)
        else:
            host.log(f"preflight warning: as said above for {first} ({w[:60].rstrip()}...)", logger.warning)
    if refusals:
        yield fail_command("\n".join(f"nemofleet refused {host.name}: {r}" for r in refusals))
        return
    host.noop("preflight passed")
