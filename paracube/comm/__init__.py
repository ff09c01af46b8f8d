"""Communication: counted collectives (and, later, autograd collectives and p2p)."""

from paracube.comm.ledger import CommCount, CommLedger

__all__ = ["CommCount", "CommLedger"]
