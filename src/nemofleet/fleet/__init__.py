"""The fleet layer: rollout, rollback, the deploy lock, rebuild and status, on top of pyinfra.

pyinfra runs each operation across all hosts and has no rolling batches, health gates, locks
or rollback. nemofleet drives it per host with --limit, the way Kamal rolls web apps:

- driver.py   the only code that runs pyinfra (`python -m pyinfra`), reads host data and facts
- (the commands run on hosts live below, in nemofleet.hostcmd; the deploy lock is its own package,
  nemofleet.lock: `with_lock(...)` there is the one way rollout, rollback, rebuild and
  `nemofleet lock` take it)
- rollout.py  batches, the health gate, rollout, rollback
- rebuild.py  disaster recovery of a reinstalled host (host key check first)
- status.py   release, drift, units, health and weights per host

cli.py imports this package, never the reverse.
"""
