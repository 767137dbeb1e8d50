"""Preflight only: report, per host, whether it can serve its plan (changes nothing).

    pyinfra -y inventories/prod.py deploys/preflight.py
    pyinfra -y @local deploys/preflight.py      # on the GPU host itself
"""
from nemofleet.deploy import preflight_only

preflight_only()
