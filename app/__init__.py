"""topicbus: one Telegram bot, many live agent processes, one forum topic each.

The public surface for follower authors is re-exported here, and listed once, in ``__all__``::

    from topicbus import FollowerClient, Delivery

(:class:`FollowerClient` from :mod:`topicbus.follower.client`, its data and errors from
:mod:`topicbus.follower.model`). It is imported lazily, so ``import topicbus`` (and the follower
client) never pulls in the leader's stack (python-telegram-bot, aiosqlite, APScheduler).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.3.0"

__all__ = [
    "Assignment",
    "Button",
    "ButtonPress",
    "Control",
    "Delivery",
    "DeliveryDeclined",
    "Edit",
    "FollowerClient",
    "FollowerClosed",
    "FollowerDownloadError",
    "FollowerError",
    "FollowerRefused",
    "FollowerSendError",
    "FollowerSuperseded",
    "__version__",
]

if TYPE_CHECKING:
    from topicbus.follower.client import FollowerClient
    from topicbus.follower.model import (Assignment, Button, ButtonPress, Control, Delivery, DeliveryDeclined, Edit,
                                         FollowerClosed, FollowerDownloadError, FollowerError, FollowerRefused,
                                         FollowerSendError, FollowerSuperseded)


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        from topicbus.follower import client, model

        return getattr(client if name == "FollowerClient" else model, name)
    raise AttributeError(f"module 'topicbus' has no attribute {name!r}")
