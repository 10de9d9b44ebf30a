"""Capability negotiation of the bus protocol (docs/protocol.md, "Capabilities").

Part of the protocol's one definition: :mod:`topicbus.protocol` re-exports every name here, and
callers import them from there. Every delivery type beyond ``message`` and every send field beyond
version 1's has a capability; neither side uses one unless the peer advertised it in its protocol
identity. Pure: no I/O, no pydantic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from topicbus.core.records import ControlItem, InboundItem

__all__ = [
    "CAP_BUTTON", "CAP_BUTTONS", "CAP_CONTROL", "CAP_DELIVER", "CAP_DISPLAY_TITLE", "CAP_EDIT", "CAP_FORMAT",
    "CAP_MEDIA", "CAP_PHOTO", "CAP_SCREEN", "CAP_SCREEN_FRAMES", "CAP_SEND", "CAP_TAIL", "CAP_TRANSCRIPT", "CONTROL_ACTION_CAPABILITIES",
    "SEND_TYPE_CAPABILITIES", "DELIVERY_CAPABILITIES", "FOLLOWER_BASE_CAPABILITIES",
    "LEADER_CAPABILITIES", "LEADER_V1_CAPABILITIES",
    "MESSAGE_ITEM", "REQUIRED_FOLLOWER_CAPABILITIES", "SEND_BASE_FIELDS", "SEND_FIELD_CAPABILITIES",
    "UNSUPPORTED_BY_LEADER", "Capabilities", "may_deliver",
]

CAP_DELIVER = "deliver-v1"  # follower: acknowledges leader.deliver (required)
CAP_DISPLAY_TITLE = "display-title-v1"  # follower: takes title changes from acks (display modes)
CAP_CONTROL = "control-v1"  # follower: receives `control` deliveries
CAP_SCREEN = "screen-v1"  # follower: takes `control` deliveries with action `screen` (sends its screen as a photo)
CAP_BUTTON = "button-v1"  # follower: receives `button` deliveries
CAP_EDIT = "edit-v1"  # follower: receives `edit` deliveries
CAP_MEDIA = "media-v1"  # follower: receives `media` deliveries
CAP_TRANSCRIPT = "transcript-v1"  # follower: a `message` delivery may carry `transcribedFrom` (a voice note's file)
CAP_SEND = "send-v1"  # leader: serves follower.send
CAP_FORMAT = "format-v1"  # leader: honours a send message's `format`
CAP_BUTTONS = "buttons-v1"  # leader: honours a send message's `buttons`
CAP_PHOTO = "photo-v1"  # leader: serves send messages of type `photo`
CAP_TAIL = "tail-v1"  # leader: honours a send message's `tail` (a line still being redrawn: replaced by what follows)
CAP_SCREEN_FRAMES = "screen-frames-v1"  # leader: a text send with `screen: true` replaces the topic's screen message

MESSAGE_ITEM = "message"  # the delivery type every follower receives
DELIVERY_CAPABILITIES: Mapping[str, str] = {
    "control": CAP_CONTROL, "button": CAP_BUTTON, "edit": CAP_EDIT, "media": CAP_MEDIA,
}
#: ``control`` actions beyond version 1's (interrupt, kill, eof), each with the capability a follower
#: advertises to take it (besides control-v1).
CONTROL_ACTION_CAPABILITIES: Mapping[str, str] = {"screen": CAP_SCREEN}
SEND_BASE_FIELDS: Mapping[str, frozenset[str]] = {  # what every version 1 leader honours
    "text": frozenset({"type", "text"}),
    "chatAction": frozenset({"type", "action"}),
    "document": frozenset({"type", "fileName", "dataBase64", "caption"}),
}
SEND_FIELD_CAPABILITIES: Mapping[str, str] = {"format": CAP_FORMAT, "buttons": CAP_BUTTONS, "tail": CAP_TAIL,
                                               "screen": CAP_SCREEN_FRAMES}
#: Send message types beyond version 1's, each with the capability a leader advertises to serve it;
#: such a type's fields are those of the named version 1 type.
SEND_TYPE_CAPABILITIES: Mapping[str, tuple[str, str]] = {"photo": (CAP_PHOTO, "document")}
LEADER_V1_CAPABILITIES = frozenset({CAP_DELIVER, CAP_SEND})  # what the first release advertised
LEADER_CAPABILITIES = (LEADER_V1_CAPABILITIES  # what this leader serves
                       | {CAP_FORMAT, CAP_PHOTO, CAP_BUTTONS, CAP_TAIL, CAP_SCREEN_FRAMES})
FOLLOWER_BASE_CAPABILITIES = frozenset({CAP_DELIVER, CAP_DISPLAY_TITLE})
REQUIRED_FOLLOWER_CAPABILITIES = frozenset({CAP_DELIVER})
#: The follower client's local refusal of a send that uses a field the leader did not advertise.
UNSUPPORTED_BY_LEADER = "unsupported-by-leader"


@dataclass(frozen=True)
class Capabilities:
    """The capability names one peer advertised, and the questions the other side asks of them."""

    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, names: Capabilities | Iterable[str] | None) -> Capabilities:
        if isinstance(names, Capabilities):
            return names
        return cls(frozenset(names or ()))

    @classmethod
    def for_follower(cls, item_types: Iterable[str] = (MESSAGE_ITEM,)) -> Capabilities:
        """What a follower advertises when it hands the delivery types ``item_types`` to its code."""
        extra = set()
        for item_type in item_types:
            if item_type != MESSAGE_ITEM:
                if item_type not in DELIVERY_CAPABILITIES:
                    raise ValueError(f"unknown delivery type {item_type!r}")
                extra.add(DELIVERY_CAPABILITIES[item_type])
        return cls(FOLLOWER_BASE_CAPABILITIES | extra)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def may_receive(self, item_type: str) -> bool:
        """Leader's question: may an item of ``item_type`` go to the follower that advertised these?
        ``message`` always may; any other type only with its capability (unknown types never)."""
        if item_type == MESSAGE_ITEM:
            return True
        needed = DELIVERY_CAPABILITIES.get(item_type)
        return needed is not None and needed in self.names

    def may_receive_control(self, action: str) -> bool:
        """Leader's question: may a ``control`` item with ``action`` go to this follower? Version 1's
        actions with control-v1; any other only with its own capability as well."""
        if CAP_CONTROL not in self.names:
            return False
        needed = CONTROL_ACTION_CAPABILITIES.get(action)
        return needed is None or needed in self.names

    def accepts_send_field(self, field: str, message_type: str) -> bool:
        """Follower's question: does the leader that advertised these honour ``field`` in a
        ``message_type`` send message? Version 1 fields always; others only with their capability."""
        typed = SEND_TYPE_CAPABILITIES.get(message_type)
        if typed is not None:
            needed_type, like = typed
            if needed_type not in self.names:
                return False
            message_type = like
        if field in SEND_BASE_FIELDS.get(message_type, frozenset({"type"})):
            return True
        needed = SEND_FIELD_CAPABILITIES.get(field)
        return needed is not None and needed in self.names

    def unsupported_send_fields(self, message: Mapping[str, Any]) -> list[str]:
        """The fields of a send ``message`` this leader would not honour (sorted; empty: send it).
        A field whose value is None asks for nothing and is never counted."""
        message_type = message.get("type")
        kind = message_type if isinstance(message_type, str) else ""
        return sorted(f for f, v in message.items() if v is not None and not self.accepts_send_field(f, kind))

    def as_list(self) -> list[str]:
        return sorted(self.names)


def may_deliver(item: InboundItem, follower_capabilities: Capabilities | Iterable[str]) -> bool:
    """Leader side, before sending a delivery ``item``: did its follower advertise the item's type
    (and, for a ``control``, its action)?"""
    capabilities = Capabilities.of(follower_capabilities)
    if isinstance(item, ControlItem):
        return capabilities.may_receive_control(item.action)
    return capabilities.may_receive(item.type)
