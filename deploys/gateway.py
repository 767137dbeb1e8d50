"""Fleet gateway: one OpenAI-compatible endpoint across the GPU hosts (HAProxy on the hosts of group `gateway`).

    pyinfra -y inventories/prod.py deploys/gateway.py --limit gateway

Its backends are `gateway_backends` (group_data/gateway.py): each GPU host's front door, or the
instance port of a single-instance host. An unhealthy host is ejected and taken back by /health
checks; the fleet's API key is checked here and again on each host. See docs/gateway.md.
"""
from nemofleet.deploy import gateway

gateway()
