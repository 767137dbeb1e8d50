"""pyinfra facts nemofleet reads from GPU hosts.

Every fact exits 0 and reports absence on stdout, so a missing tool never fails the host
(pyinfra runs a fact command per call: no caching). `host.HostFacts` runs all host-level facts in one remote command.
"""
