"""Main job: take GPU hosts to serving Nemotron on vLLM; converge serving hosts with zero changes.

    pyinfra -y inventories/prod.py deploys/nemotron.py

Stages: preflight (refuses a host that cannot serve, before any change) -> host configuration
(daemon.json, secrets, CDI) -> weights (through the Hugging Face mirror, verified) -> serving
(systemd units per instance, frontend networks) -> health (cron checks, Prometheus metrics).
"""
from nemofleet import pyinfra_speedups as speed
from nemofleet.deploy import nemotron

speed.install()  # pyinfra's per-operation call-site lookup and global-argument list, cheaper (nemofleet/pyinfra_speedups.py)

nemotron()
