"""Example production inventory: one list per GPU class (group_data/gpu_<class>.py applies).

Replace the addresses with your hosts. Per-host data overrides group data, e.g. a host
that should serve two TP=4 instances of Super VL instead of the class default.
"""

gpu_a100 = [
    ("a100-01.example.internal", {"ssh_user": "root"}),
]

gpu_h100 = [
    ("h100-01.example.internal", {"ssh_user": "root"}),
    ("h100-02.example.internal", {"ssh_user": "root", "model": "nemotron-3.5-super-vl-bf16"}),
]

gpu_h200 = [
    ("h200-01.example.internal", {"ssh_user": "root"}),
]

# The fleet gateway (deploys/gateway.py, docs/gateway.md): one endpoint across the hosts above, e.g.
#   pyinfra -y inventories/prod.py deploys/gateway.py --limit gateway
# Its backends are listed in group_data/gateway.py (deploys/nemotron.py leaves this group alone).
# gateway = [
#     ("gw-01.example.internal", {"ssh_user": "root"}),
# ]

# A multi-node serving group (docs/multi-node.md, docs/recipes.md#multi-node):
# one model over several hosts of one GPU class, the head first; their shared settings (the model,
# the image, the flags) go in the class's group data or in each member's data alike, e.g.
#   gpu_a100 += [("a100-02.example.internal", {"ssh_user": "root"}),
#                ("a100-03.example.internal", {"ssh_user": "root"})]
#   serving_groups = {"svl-a100": ["a100-02.example.internal", "a100-03.example.internal"]}

from nemofleet.inventory import checked  # noqa: E402  (an empty inventory or a --limit typo stops the run)

checked(globals())
