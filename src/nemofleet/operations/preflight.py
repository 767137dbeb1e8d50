"""The preflight verdict: fail a host that cannot serve, before anything changes."""

from pyinfra import host, logger
from pyinfra.api import operation

from . import fail_command


@operation(is_idempotent=True)
def verdict(refusals: list[str], warnings: list[str] | None = None):
    """Fail this host with one sentence per refusal; log warnings; otherwise change nothing."""
    for w in warnings or []:
        host.log(f"preflight warning: {w}", logger.warning)
    if refusals:
        yield fail_command("\n".join(f"nemofleet refused {host.name}: {r}" for r in refusals))
        return
    host.noop("preflight passed")
