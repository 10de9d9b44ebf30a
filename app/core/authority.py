"""Who leads, and whether a change may still be published under that lead.

The leader lease (one row in the store) names an owner and an epoch; a leader-side mutation is
started under the :class:`Authority` it read, and the store refuses it with :class:`AuthorityLost`
once the lease changed hands. The store adapters raise it; the leader's use cases, the poller and
the bus catch it.
"""

from __future__ import annotations

from dataclasses import dataclass


class AuthorityLost(Exception):
    """The leader lease changed hands; the mutation was not published."""


@dataclass(frozen=True)
class Authority:
    """The lease a leader-side mutation was started under."""

    owner: str
    epoch: int
