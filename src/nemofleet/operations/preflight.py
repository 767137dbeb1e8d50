"""The preflight verdict: fail a host that cannot serve, before anything changes."""

import sys

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


def dry_run() -> bool:
    """Whether this is `pyinfra --dry`: pyinfra decides it after the operations are prepared and
    keeps it out of its state, so the command line is what says it."""
    return "--dry" in sys.argv[1:]


def say_if_dry(refusals: list[str]) -> None:
    """Under --dry no operation runs (with -y not even its change detection), so the verdict's
    failing command never says its sentences: say them now, while the deploy is prepared."""
    if refusals and dry_run():
        for r in refusals:
            host.log(f"preflight would refuse this host: {r}", logger.error)
