"""The deploy lock, one package: every part of it on the controller.

- info.py   the lock's info read back (`key=value` lines -> holder, expiry), the sentences that name
            a holder, and the one `operator()`; pure, shared by everything below
- fact.py   `DeployLock`, the pyinfra fact the deploy's preflight reads (a foreign lock refuses the host)
- run.py    a plain `pyinfra ... deploys/nemotron.py` takes the lock before its first change and gives
            it back at disconnect
- fleet.py  `with_lock(...)`: the one way rollout, rollback, rebuild and `nemofleet lock` take it

On the host the lock is the program remote/lock.py (a directory that appears with its info file in
one atomic rename); hostcmd.py builds the command lines that run it. Both stay where every host
program and command builder lives, so that the lock's host side travels like the others.

Nothing is imported here: fact.py sits below the decision's facts, run.py in the deploy's stage
and fleet.py in the fleet layer (tests/unit/test_layers.py names the layers).
"""
