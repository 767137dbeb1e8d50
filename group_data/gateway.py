"""Data of the fleet gateway hosts (inventory group `gateway`, deploys/gateway.py; docs/gateway.md).

One entry per GPU host serving the model: its front door (front_door_port, with front_door_address
set on that host so the gateway can reach it) or, for a single-instance host, its instance port
(port_base, with bind_address set on that host). The fleet's API key (group_data/all.py) is
checked here and again on each host. Example:

gateway_backends = [
    {"host": "10.0.0.11", "port": 8800, "name": "h100-01"},  # 8 instances behind its front door
    {"host": "10.0.0.12", "port": 8000, "name": "h200-01"},  # one instance
]
gateway_port = 8800          # clients: http://<gateway>:8800/v1
gateway_address = "0.0.0.0"  # or one address of the gateway host
gateway_fall = 3             # failed /health checks (2 s apart) before a host is ejected
gateway_rise = 2             # passed checks before it takes requests again
"""
