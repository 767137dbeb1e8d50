"""Network reachability between hosts (a multi-node serving group's worker -> its head)."""

from __future__ import annotations

from . import Fact

from .. import shell

REACH_TIMEOUT = 3  # seconds: a reachable host answers a TCP SYN (accepted or refused) in well under this


class TcpReach(Fact):
    """"open" (something listens), "refused" (the host answered: reachable, nothing listens yet) or
    "silent" (no answer within REACH_TIMEOUT s: a firewall drops it, or there is no route) for a
    TCP connection from this host to address:port. Uses bash's /dev/tcp (no nc needed)."""

    def command(self, address: str, port: int) -> str:
        # a constant program; the address and port are its arguments, joined by the one boundary
        probe = shell.join(["timeout", REACH_TIMEOUT, "bash", "-c", 'exec 3<>"/dev/tcp/$1/$2"', "reach",
                            address, int(port)])
        return (f"if {probe} 2>/dev/null; then echo open; "
                f"elif [ $? -eq 124 ]; then echo silent; else echo refused; fi")

    def parse(self, output):
        word = (output[0] if output else "").strip()
        return word if word in ("open", "refused", "silent") else None
