"""Bus protocol v1, defined once: envelope kinds, the models of both directions, builders, capabilities.

`docs/protocol.md` is the human contract; this module is its single implementation, used by the
leader's bus server, the follower client and the tests' fake leader:

* follower → leader: built with :func:`register_frame`, :func:`heartbeat_frame`,
  :func:`disconnect_frame`, :func:`send_frame` (messages from :func:`text_message`,
  :func:`chat_action_message`, :func:`document_message`) and :func:`receipt_frame`; decoded by the
  leader with :func:`decode_frame` into one of :data:`FollowerFrame`'s models;
* leader → follower: built with :func:`ack`, :func:`error_ack`, :func:`deliver_frame` (items from
  :func:`message_item`) and :func:`superseded_frame`; decoded by followers with
  :func:`decode_leader_frame`;
* the leader's records (:mod:`topicbus.core.records`) and the wire, one converter each way:
  :func:`output_item` (a ``follower.send`` message → its outbox item), :func:`leader_frame` (a
  delivery or a supersession → its frame, items by :func:`wire_item`) and :func:`wire_result` (an
  answer → an ack's ``result``). The wire models here carry the records' names;
* :class:`Capabilities`: what each side may send the other (docs/protocol.md, "Capabilities"); defined with the capability
  names in :mod:`topicbus.capabilities` and re-exported here.

Both directions ignore fields they do not know (a newer peer may add some) and are strict on the
types of the fields they know. Parsing never raises anything but :class:`ProtocolError`, whose
message names the field but never echoes input.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from topicbus.capabilities import (  # noqa: F401 - re-exported: the protocol is defined in one place
    CAP_BUTTON, CAP_BUTTONS, CAP_CONTROL, CAP_DELIVER, CAP_DISPLAY_TITLE, CAP_EDIT, CAP_FORMAT, CAP_MEDIA, CAP_PHOTO,
    CAP_SCREEN, CAP_SCREEN_FRAMES, CAP_SEND, CAP_TAIL, CAP_TRANSCRIPT, CONTROL_ACTION_CAPABILITIES, DELIVERY_CAPABILITIES,
    FOLLOWER_BASE_CAPABILITIES,
    LEADER_CAPABILITIES, LEADER_V1_CAPABILITIES, MESSAGE_ITEM,
    REQUIRED_FOLLOWER_CAPABILITIES, SEND_BASE_FIELDS, SEND_FIELD_CAPABILITIES, SEND_TYPE_CAPABILITIES,
    UNSUPPORTED_BY_LEADER, Capabilities, may_deliver,
)
from topicbus.core import records

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20
MAX_DOCUMENT_BYTES = 512 * 1024
MAX_TEXT_CHARS = 4096
# Files in one ``media`` item. Telegram sends albums of up to 10, but that is its limit, not ours: an
# album with more parts is delivered whole, in items of at most this many files (a few KB each).
MAX_MEDIA_FILES = 100
BUS_PATH = "/v1/bus"
FILES_PATH = "/v1/files"  # GET /v1/files/<fileId>: a routed owner document (Bearer secret)
MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit integer on every POSIX system we run on
MAX_ERROR_DETAIL_CHARS = 160


class Kind(StrEnum):
    REGISTER = "follower.register"
    HEARTBEAT = "follower.heartbeat"
    DISCONNECT = "follower.disconnect"
    SEND = "follower.send"
    ACK = "bus.ack"
    DELIVER = "leader.deliver"
    SUPERSEDED = "leader.superseded"


class ErrorCode(StrEnum):
    INVALID_ENVELOPE = "invalid-envelope"
    UNKNOWN_KIND = "unknown-kind"
    INCOMPATIBLE_PROTOCOL = "incompatible-protocol"
    MISSING_GENERATION = "missing-generation"
    UNKNOWN_INSTANCE = "unknown-instance"
    STALE_GENERATION = "stale-generation"
    FOREIGN_TARGET = "foreign-target"
    REQUEST_ID_COLLISION = "request-id-collision"
    NOT_LEADER = "not-leader"
    SLOT_UNAVAILABLE = "slot-unavailable"
    BLOCKED_BY_RETIREMENT = "blocked-by-retirement"
    TELEGRAM_ERROR = "telegram-error"
    BACKLOG_FULL = "backlog-full"  # the follower's outbox is at its cap: retry later (backpressure)
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A frame that cannot be served; on the leader it becomes an error ack with ``code``."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


Id = Annotated[str, StringConstraints(min_length=1, max_length=128)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Text = Annotated[str, StringConstraints(max_length=MAX_FRAME_BYTES)]  # valid Unicode: lone surrogates refused


class _Strict(BaseModel):
    """Strict about the types of known fields, silent about unknown ones (forward compatibility).

    ``defer_build``: a model's validator is built at its first use, not at import, so a start
    (the leader's cold start, ``follow``'s) does not pay about 30 ms for frames it may never see."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True, defer_build=True)


Model = TypeVar("Model", bound=_Strict)


class ProtocolIdentity(_Strict):
    """A follower's ``protocol`` field, as the leader accepts it (at most 32 capabilities)."""

    version: int
    build: ShortText
    capabilities: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=128)]], Field(max_length=32)] = []


# ---- follower → leader ----------------------------------------------------------------------


class TargetRef(_Strict):
    chat_id: int = Field(alias="chatId")
    thread_id: int | None = Field(default=None, alias="threadId")


class Registration(_Strict):
    kind: ClassVar[Kind] = Kind.REGISTER
    request_id: Id = Field(alias="requestId")
    instance_id: Id = Field(alias="instanceId")
    registration_generation: str | None = Field(default=None, alias="registrationGeneration", max_length=128)
    pid: Annotated[int, Field(gt=0, le=MAX_PID)] | None = None
    process_birth_id: Annotated[str, StringConstraints(max_length=256)] | None = Field(default=None, alias="processBirthId")
    host_id: Annotated[str, StringConstraints(max_length=256)] | None = Field(default=None, alias="hostId")
    cwd: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    session_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(default=None, alias="sessionId")
    name: ShortText | None = None
    profile_key: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(default=None, alias="profileKey")
    thread_name: ShortText | None = Field(default=None, alias="threadName")
    slot: Annotated[str, StringConstraints(pattern=r"^[A-Z]$")] | None = None
    target: TargetRef | None = None
    protocol: ProtocolIdentity | None = None


class FollowerRequest(_Strict):
    """A follower request bound to one registration generation (:class:`Heartbeat`, :class:`Disconnect`,
    :class:`SendRequest`, which adds a message).

    The leader serves it only while ``registrationGeneration`` is the live one of ``instanceId``."""

    kind: ClassVar[Kind]
    request_id: Id = Field(alias="requestId")
    instance_id: Id = Field(alias="instanceId")
    registration_generation: str | None = Field(default=None, alias="registrationGeneration", max_length=128)


class Heartbeat(FollowerRequest):
    """``follower.heartbeat``: the follower is alive (answered with the topic's title)."""

    kind: ClassVar[Kind] = Kind.HEARTBEAT


class Disconnect(FollowerRequest):
    """``follower.disconnect``: the follower leaves gracefully."""

    kind: ClassVar[Kind] = Kind.DISCONNECT


TextFormat = Literal["plain", "markdown", "html", "pre"]
MAX_BUTTON_ROWS = 8
MAX_BUTTONS_PER_ROW = 8


class Button(_Strict):
    """One inline button a follower attaches; ``data`` comes back in a ``button`` delivery when an
    owner presses it (the leader keeps the data and gives Telegram a short id: callback data ≤ 64 bytes)."""

    text: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    data: Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class TextMessage(_Strict):
    type: Literal["text"]
    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]
    format: TextFormat | None = None  # needs format-v1; None: plain
    buttons: Annotated[list[Annotated[list[Button], Field(min_length=1, max_length=MAX_BUTTONS_PER_ROW)]],
                       Field(min_length=1, max_length=MAX_BUTTON_ROWS)] | None = None  # needs buttons-v1
    #: needs tail-v1: the current state of a line still being redrawn (a progress bar), shown at the end
    #: of the topic's live message and replaced by whatever the follower sends next
    tail: bool | None = None
    #: needs screen-frames-v1: this text is the latest frame of a full-screen program; it replaces the
    #: topic's screen message (edited in place), and only the newest pending frame is sent.
    screen: bool | None = None


class ChatActionMessage(_Strict):
    type: Literal["chatAction"]
    action: Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")]


class DocumentMessage(_Strict):
    type: Literal["document"]
    file_name: Annotated[str, StringConstraints(min_length=1, max_length=255)] = Field(alias="fileName")
    data_base64: Annotated[str, StringConstraints(max_length=(MAX_DOCUMENT_BYTES * 4) // 3 + 8)] = Field(alias="dataBase64")
    caption: Annotated[str, StringConstraints(max_length=1024)] | None = None

    @field_validator("data_base64")
    @classmethod
    def _valid_base64(cls, value: str) -> str:
        # Checked here, not when posting: an undecodable document would otherwise be acked and then
        # wedge its topic's outbox.
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be valid base64") from None
        if not data or len(data) > MAX_DOCUMENT_BYTES:
            raise ValueError(f"must decode to 1..{MAX_DOCUMENT_BYTES} bytes")
        return value


class PhotoMessage(DocumentMessage):
    """An image (PNG, JPEG, WebP) shown as a photo (``sendPhoto``); needs photo-v1."""

    type: Literal["photo"]  # type: ignore[assignment]


OutboundMessage = Annotated[TextMessage | ChatActionMessage | DocumentMessage | PhotoMessage,
                            Field(discriminator="type")]


class SendRequest(FollowerRequest):
    """``follower.send``: one message for the follower's topic (:func:`output_item` is its outbox item)."""

    kind: ClassVar[Kind] = Kind.SEND
    message: OutboundMessage
    chat_id: int | None = Field(default=None, alias="chatId")
    thread_id: int | None = Field(default=None, alias="threadId")

    @property
    def item(self) -> records.OutboxItem:
        """The message as the leader keeps it (:func:`output_item`)."""
        return output_item(self.message)


class Receipt(_Strict):
    """The follower's ``bus.ack`` for one ``leader.deliver`` (``requestId`` is the deliveryId)."""

    kind: ClassVar[Kind] = Kind.ACK
    request_id: Id = Field(alias="requestId")
    ok: bool = True


# ---- leader → follower ----------------------------------------------------------------------


class LeaderIdentity(_Strict):
    """The leader's ``protocol`` field in registration answers, as followers read it: unbounded in
    count, so that a later leader may advertise more capabilities than this version knows."""

    version: int
    build: Text
    capabilities: list[Text] = []


class AckError(_Strict):
    code: Text
    message: Text = ""


class Ack(_Strict):
    """``bus.ack``: the leader's one answer to a request."""

    request_id: Text = Field(alias="requestId")
    ok: bool
    result: dict[str, Any] | None = None
    error: AckError | None = None
    protocol: LeaderIdentity | None = None  # on registration answers

    @property
    def error_code(self) -> str:
        return self.error.code if self.error is not None else "unknown"

    @property
    def error_message(self) -> str:
        return self.error.message if self.error is not None else ""

    def result_as(self, model: type[Model]) -> Model | None:
        """The result read as ``model`` (a missing result reads as ``{}``); None when it does not fit."""
        try:
            return model.model_validate(self.result or {})
        except ValidationError:
            return None


class RegistrationResult(_Strict):
    """The target assigned by ``follower.register``."""

    chat_id: int = Field(alias="chatId")
    thread_id: int = Field(alias="threadId")
    slot: Text
    display_title: Text = Field(default="", alias="displayTitle")
    binding_key: Text = Field(default="", alias="bindingKey")


class HeartbeatResult(_Strict):
    display_title: Text | None = Field(default=None, alias="displayTitle")


class SendResult(_Strict):
    outbox_id: int | None = Field(default=None, alias="outboxId")


class DocumentRef(_Strict):
    """A routed owner document; the bytes are at ``GET /v1/files/<fileId>``."""

    file_id: Text | None = Field(default=None, alias="fileId")
    file_name: Text | None = Field(default=None, alias="fileName")
    mime_type: Text | None = Field(default=None, alias="mimeType")
    file_size: int | None = Field(default=None, alias="fileSize")


class ReplyContext(_Strict):
    """What an owner message replied to: the replied-to message, and the quoted part if any."""

    message_id: int | None = Field(default=None, alias="messageId")
    text: Text | None = None  # its text, else its caption
    from_name: Text | None = Field(default=None, alias="fromName")
    from_agent: bool = Field(default=False, alias="fromAgent")  # the agent's own output (posted by the bot)
    quote: Text | None = None


class FileRef(DocumentRef):
    """One file of a ``media`` delivery: its kind and, for sound and video, its duration."""

    kind: Literal["document", "photo", "voice", "audio", "video", "video_note", "animation"] = "document"
    duration: int | None = None  # seconds
    too_large: bool = Field(default=False, alias="tooLarge")  # over the Bot API's 20 MB download limit


class MessageItem(_Strict):
    """Delivery type ``message``: one owner message (every follower receives these)."""

    type: Literal["message"]
    text: Text | None = None
    caption: Text | None = None
    message_id: int | None = Field(default=None, alias="messageId")
    from_user_id: int | None = Field(default=None, alias="fromUserId")
    from_name: Text | None = Field(default=None, alias="fromName")
    date: int | None = None
    document: DocumentRef | None = None
    reply: ReplyContext | None = None
    # transcript-v1: ``text`` is the leader's transcript of this voice note or audio file (the owner
    # spoke it); absent from every other message, and never sent to a follower without the capability.
    transcribed_from: FileRef | None = Field(default=None, alias="transcribedFrom")


class MediaItem(_Strict):
    """Delivery type ``media`` (media-v1): voice, audio, video, video notes, animations, photos and
    documents — one message, or a whole album as one item."""

    type: Literal["media"]
    files: Annotated[list[FileRef], Field(min_length=1, max_length=MAX_MEDIA_FILES)]
    caption: Text | None = None
    message_id: int | None = Field(default=None, alias="messageId")  # the first message of an album
    from_user_id: int | None = Field(default=None, alias="fromUserId")
    from_name: Text | None = Field(default=None, alias="fromName")
    date: int | None = None
    reply: ReplyContext | None = None


class EditItem(_Strict):
    """Delivery type ``edit`` (edit-v1): an owner edited a message the follower already received."""

    type: Literal["edit"]
    message_id: int = Field(alias="messageId")
    text: Text | None = None  # the new text, else the new caption


class ControlItem(_Strict):
    """Delivery type ``control`` (control-v1): a reserved command for this follower generation only
    (``/interrupt``, ``/kill``, ``/eof``, or the Interrupt button; ``/screen`` only with screen-v1);
    never redelivered to a successor."""

    type: Literal["control"]
    action: Literal["interrupt", "kill", "eof", "screen"]
    message_id: int | None = Field(default=None, alias="messageId")


class ButtonItem(_Strict):
    """Delivery type ``button`` (button-v1): an owner pressed one of this follower's inline buttons."""

    type: Literal["button"]
    data: Text
    message_id: int | None = Field(default=None, alias="messageId")  # the message that carried the button
    from_user_id: int | None = Field(default=None, alias="fromUserId")


# Each delivery type beyond ``message`` has its capability in DELIVERY_CAPABILITIES.
DeliveryItem = Annotated[Union[MessageItem, MediaItem, EditItem, ControlItem, ButtonItem],  # noqa: UP007
                         Field(discriminator="type")]


class Deliver(_Strict):
    """``leader.deliver``: one routed inbound item, acknowledged with a receipt."""

    request_id: Id = Field(alias="requestId")
    delivery_id: Id | None = Field(default=None, alias="deliveryId")
    instance_id: Text | None = Field(default=None, alias="instanceId")
    registration_generation: Text | None = Field(default=None, alias="registrationGeneration")
    item: DeliveryItem

    @property
    def id(self) -> str:
        """The id the receipt carries: ``deliveryId``, else the ``requestId``."""
        return self.delivery_id or self.request_id


class Superseded(_Strict):
    """``leader.superseded``: a newer registration took this workspace identity over."""

    request_id: Text | None = Field(default=None, alias="requestId")
    instance_id: Text | None = Field(default=None, alias="instanceId")
    reason: Text | None = None


LeaderFrame = Ack | Deliver | Superseded
#: What a follower sends the leader; each model's ``kind`` is its envelope kind.
FollowerFrame = Registration | Heartbeat | Disconnect | SendRequest | Receipt

# ---- decoding -------------------------------------------------------------------------------

_MODELS: dict[str, type[_Strict]] = {model.kind: model for model in (Registration, Heartbeat, Disconnect,
                                                                      SendRequest, Receipt)}
_LEADER_MODELS: dict[str, type[_Strict]] = {Kind.ACK: Ack, Kind.DELIVER: Deliver, Kind.SUPERSEDED: Superseded}


def decode_frame(text: str) -> FollowerFrame:
    """Leader side: parse one follower frame (:class:`Registration`, :class:`Heartbeat`,
    :class:`Disconnect`, :class:`SendRequest` or :class:`Receipt`); :class:`ProtocolError` when invalid."""
    return _decode(text, _MODELS)  # type: ignore[return-value]


def decode_leader_frame(text: str) -> LeaderFrame:
    """Follower side: parse one leader frame (:class:`Ack`, :class:`Deliver` or :class:`Superseded`);
    :class:`ProtocolError` when invalid (``unknown-kind`` for a kind this version does not know)."""
    return _decode(text, _LEADER_MODELS)  # type: ignore[return-value]


def _decode(text: str, models: dict[str, type[_Strict]]) -> _Strict:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, "Frame is not valid JSON.") from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, "Frame must be a JSON object.")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, "Field 'kind' must be a string.")
    model = models.get(kind)
    if model is None:
        raise ProtocolError(ErrorCode.UNKNOWN_KIND, f"Unknown envelope kind {kind[:64]!r}.")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, describe_errors(exc)) from None


def request_id_of(text: str) -> str:
    """Best-effort request id of a frame that failed to parse, for the error ack."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return "invalid"
    rid = raw.get("requestId") if isinstance(raw, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= 128 and _encodable(rid) else "invalid"


def _encodable(text: str) -> bool:
    """False for text with lone surrogates (``"\\ud800"`` in JSON): it cannot be sent back as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def describe_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"])[:MAX_ERROR_DETAIL_CHARS] or "envelope"
        if err["type"] == "union_tag_invalid":  # pydantic's text quotes the offending input tag
            msg = "Input tag does not match any of the expected tags"
        else:
            msg = err["msg"]
        parts.append(f"{loc}: {msg[:MAX_ERROR_DETAIL_CHARS]}")
    return "Invalid envelope: " + "; ".join(parts) + "."


def check_compatibility(identity: ProtocolIdentity | None) -> str | None:
    """Return the incompatibility reason, or None when the follower may register."""
    if identity is None:
        return "missing-identity"
    if identity.version != PROTOCOL_VERSION:
        return "version-mismatch"
    if not REQUIRED_FOLLOWER_CAPABILITIES.issubset(identity.capabilities):
        return "missing-capability"
    return None


# ---- builders -------------------------------------------------------------------------------


def leader_identity(build: str, capabilities: Iterable[str] = LEADER_CAPABILITIES) -> dict[str, Any]:
    return {"version": PROTOCOL_VERSION, "build": build, "capabilities": sorted(set(capabilities))}


def follower_identity(build: str, capabilities: Capabilities | None = None) -> dict[str, Any]:
    """A follower's ``protocol`` field; by default it receives ``message`` deliveries only."""
    names = (capabilities or Capabilities.for_follower()).as_list()
    return {"version": PROTOCOL_VERSION, "build": build, "capabilities": names}


def register_frame(request_id: str, instance_id: str, generation: str, *, protocol: Mapping[str, Any],
                   pid: int | None = None, process_birth_id: str | None = None, host_id: str | None = None,
                   cwd: str | None = None, session_id: str | None = None, name: str | None = None,
                   thread_name: str | None = None) -> dict[str, Any]:
    """``follower.register``; optional fields that are None are left out."""
    frame = _generation_bound(Kind.REGISTER, request_id, instance_id, generation)
    optional = {"pid": pid, "processBirthId": process_birth_id, "hostId": host_id, "protocol": dict(protocol),
                "cwd": cwd, "sessionId": session_id, "name": name, "threadName": thread_name}
    frame.update((k, v) for k, v in optional.items() if v is not None)
    return frame


def heartbeat_frame(request_id: str, instance_id: str, generation: str | None) -> dict[str, Any]:
    return _generation_bound(Kind.HEARTBEAT, request_id, instance_id, generation)


def disconnect_frame(request_id: str, instance_id: str, generation: str | None) -> dict[str, Any]:
    return _generation_bound(Kind.DISCONNECT, request_id, instance_id, generation)


def send_frame(request_id: str, instance_id: str, generation: str | None, message: Mapping[str, Any]) -> dict[str, Any]:
    """``follower.send`` of one ``message`` (see :func:`text_message` and the others)."""
    frame = _generation_bound(Kind.SEND, request_id, instance_id, generation)
    frame["message"] = dict(message)
    return frame


def _generation_bound(kind: Kind, request_id: str, instance_id: str, generation: str | None) -> dict[str, Any]:
    return {"kind": kind.value, "requestId": request_id, "instanceId": instance_id,
            "registrationGeneration": generation}


def text_message(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def chat_action_message(action: str = "typing") -> dict[str, Any]:
    return {"type": "chatAction", "action": action}


def document_message(file_name: str, data: bytes, caption: str | None = None) -> dict[str, Any]:
    message = {"type": "document", "fileName": file_name, "dataBase64": base64.b64encode(data).decode("ascii")}
    if caption is not None:
        message["caption"] = caption
    return message


def receipt_frame(delivery_id: str) -> dict[str, Any]:
    """The follower's receipt for one ``leader.deliver``."""
    return {"kind": Kind.ACK.value, "requestId": delivery_id, "ok": True}


def ack(request_id: str, result: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    frame: dict[str, Any] = {"kind": Kind.ACK.value, "requestId": request_id, "ok": True}
    if result is not None:
        frame["result"] = result
    frame.update(extra)
    return frame


def error_ack(request_id: str, code: ErrorCode | str, message: str, **extra: Any) -> dict[str, Any]:
    frame = {"kind": Kind.ACK.value, "requestId": request_id, "ok": False,
             "error": {"code": str(code), "message": message}}
    frame.update(extra)
    return frame


def message_item(**fields: Any) -> dict[str, Any]:
    """A ``message`` delivery item, validated, with every field present (absent ones as null).
    Fields by their wire names (``text``, ``messageId``, ``fromUserId``, ``document`` …);
    ``transcribedFrom`` only when given."""
    item = MessageItem.model_validate({**fields, "type": MESSAGE_ITEM}).model_dump(by_alias=True)
    if item.get("transcribedFrom") is None:
        item.pop("transcribedFrom", None)
    return item


def deliver_frame(delivery_id: str, instance_id: str, generation: str, item: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": Kind.DELIVER.value, "requestId": delivery_id, "deliveryId": delivery_id,
            "instanceId": instance_id, "registrationGeneration": generation, "item": dict(item)}


def superseded_frame(instance_id: str, reason: str) -> dict[str, Any]:
    return {"kind": Kind.SUPERSEDED.value, "requestId": f"superseded:{instance_id}", "instanceId": instance_id,
            "reason": reason}


def encode(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


# ---- the leader's records ⇄ the wire: one converter each way ----------------------------------------


def output_item(message: TextMessage | ChatActionMessage | DocumentMessage | PhotoMessage) -> records.OutboxItem:
    """A validated ``follower.send`` message as the leader keeps it: its outbox item (a file's bytes
    decoded from base64; ``tail`` and ``screen`` false when absent)."""
    if isinstance(message, TextMessage):
        buttons = tuple(tuple(records.Button(b.text, b.data) for b in row) for row in message.buttons or ())
        return records.TextMessage(message.text, message.format, buttons, bool(message.tail), bool(message.screen))
    if isinstance(message, ChatActionMessage):
        return records.ChatActionMessage(message.action)
    kind = records.PhotoMessage if isinstance(message, PhotoMessage) else records.DocumentMessage
    return kind(message.file_name, base64.b64decode(message.data_base64), message.caption)


def leader_frame(frame: records.Deliver | records.Superseded) -> dict[str, Any]:
    """A frame the leader pushes to a follower, as it goes on the wire."""
    if isinstance(frame, records.Deliver):
        return deliver_frame(frame.delivery_id, frame.instance_id, frame.registration_generation,
                             wire_item(frame.item))
    return superseded_frame(frame.instance_id, frame.reason)


def wire_item(item: records.InboundItem) -> dict[str, Any]:
    """A delivery item as ``leader.deliver`` carries it: every field of its type present (absent ones as
    null), a message's ``transcribedFrom`` only when it has one."""
    if isinstance(item, records.MessageItem):
        wire = {"type": MESSAGE_ITEM, "text": item.text, "caption": item.caption, "messageId": item.message_id,
                "fromUserId": item.from_user_id, "fromName": item.from_name, "date": item.date,
                "document": None if item.document is None else _wire_document(item.document),
                "reply": None if item.reply is None else _wire_reply(item.reply)}
        if item.transcribed_from is not None:
            wire["transcribedFrom"] = _wire_file(item.transcribed_from)
        return wire
    if isinstance(item, records.MediaItem):
        return {"type": "media", "files": [_wire_file(f) for f in item.files], "caption": item.caption,
                "messageId": item.message_id, "fromUserId": item.from_user_id, "fromName": item.from_name,
                "date": item.date, "reply": None if item.reply is None else _wire_reply(item.reply)}
    if isinstance(item, records.EditItem):
        return {"type": "edit", "messageId": item.message_id, "text": item.text}
    if isinstance(item, records.ControlItem):
        return {"type": "control", "action": item.action, "messageId": item.message_id}
    if isinstance(item, records.ButtonItem):
        return {"type": "button", "data": item.data, "messageId": item.message_id, "fromUserId": item.from_user_id}
    raise ValueError(f"no follower takes an item of type {item.type!r}")


def _wire_document(document: records.DocumentRef) -> dict[str, Any]:
    return {"fileId": document.file_id, "fileName": document.file_name, "mimeType": document.mime_type,
            "fileSize": document.file_size}


def _wire_file(file: records.FileRef) -> dict[str, Any]:
    return {"fileId": file.file_id, "fileName": file.file_name, "mimeType": file.mime_type,
            "fileSize": file.file_size, "kind": file.kind, "duration": file.duration, "tooLarge": file.too_large}


def _wire_reply(reply: records.ReplyContext) -> dict[str, Any]:
    return {"messageId": reply.message_id, "text": reply.text, "fromName": reply.from_name,
            "fromAgent": reply.from_agent, "quote": reply.quote}


def wire_result(result: records.RequestResult | None) -> dict[str, Any]:
    """An answer to a follower request as its ack's ``result`` (None, a disconnect's: ``{}``)."""
    if isinstance(result, records.RegistrationResult):
        return {"chatId": result.chat_id, "threadId": result.thread_id, "slot": result.slot,
                "displayTitle": result.display_title, "bindingKey": result.binding_key}
    if isinstance(result, records.HeartbeatResult):
        return {"displayTitle": result.display_title}
    if isinstance(result, records.SendResult):
        return {"outboxId": result.outbox_id}
    return {}
