"""Two Ubuntu 24.04 VMs from the Vagrantfile (`vagrant up`); GPU passthrough is optional:
without a GPU the preflight refuses the VM with its sentence and changes nothing."""

gpu_a100 = [("a100-vm", {"ssh_hostname": "192.168.56.11", "ssh_user": "vagrant", "_sudo": True,
                         "ssh_key": ".vagrant/machines/a100-vm/virtualbox/private_key"})]
gpu_h100 = [("h100-vm", {"ssh_hostname": "192.168.56.12", "ssh_user": "vagrant", "_sudo": True,
                         "ssh_key": ".vagrant/machines/h100-vm/virtualbox/private_key"})]

from nemofleet.inventory import checked  # noqa: E402  (an empty inventory or a --limit typo stops the run)

checked(globals())
