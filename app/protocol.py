"""Bus protocol v1: envelope kinds, validation and builders shared by leader and followers.

`docs/protocol.md` is the human contract; this module is its single implementation. Parsing never
raises anything but :class:`ProtocolError`, whose message names the field but never echoes input.
"""

from __future__ import annotations

import base64
import binascii
import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20
MAX_DOCUMENT_BYTES = 512 * 1024
MAX_TEXT_CHARS = 4096
BUS_PATH = "/v1/bus"
FILES_PATH = "/v1/files"  # GET /v1/files/<fileId>: a routed owner document (Bearer secret)
MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit integer on every POSIX system we run on
MAX_ERROR_DETAIL_CHARS = 160
CAP_DELIVER = "deliver-v1"
CAP_SEND = "send-v1"
CAP_DISPLAY_TITLE = "display-title-v1"  # the follower takes title changes from acks (display modes)
LEADER_CAPABILITIES = (CAP_DELIVER, CAP_SEND)
REQUIRED_FOLLOWER_CAPABILITIES = frozenset({CAP_DELIVER})


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
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A request that cannot be served; becomes an error ack with ``code``."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


Id = Annotated[str, StringConstraints(min_length=1, max_length=128)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)


class ProtocolIdentity(_Strict):
    version: int
    build: ShortText
    capabilities: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=128)]], Field(max_length=32)] = []


class TargetRef(_Strict):
    chat_id: int = Field(alias="chatId")
    thread_id: int | None = Field(default=None, alias="threadId")


class Registration(_Strict):
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
    """A follower request bound to one registration generation (heartbeat, disconnect; send adds a message).

    The leader serves it only while ``registrationGeneration`` is the live one of ``instanceId``."""

    request_id: Id = Field(alias="requestId")
    instance_id: Id = Field(alias="instanceId")
    registration_generation: str | None = Field(default=None, alias="registrationGeneration", max_length=128)


class TextMessage(_Strict):
    type: Literal["text"]
    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS)]


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


OutboundMessage = Annotated[TextMessage | ChatActionMessage | DocumentMessage, Field(discriminator="type")]


class SendRequest(FollowerRequest):
    message: OutboundMessage
    chat_id: int | None = Field(default=None, alias="chatId")
    thread_id: int | None = Field(default=None, alias="threadId")


class Receipt(_Strict):
    request_id: Id = Field(alias="requestId")
    ok: bool = True


_MODELS: dict[str, type[_Strict]] = {
    Kind.REGISTER: Registration,
    Kind.HEARTBEAT: FollowerRequest,
    Kind.DISCONNECT: FollowerRequest,
    Kind.SEND: SendRequest,
    Kind.ACK: Receipt,
}


def decode_frame(text: str) -> tuple[Kind, Any, dict[str, Any]]:
    """Parse one text frame into ``(kind, model, raw)``; raise :class:`ProtocolError` when invalid."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, "Frame is not valid JSON.") from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, "Frame must be a JSON object.")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID_ENVELOPE, "Field 'kind' must be a string.")
    model = _MODELS.get(kind)
    if model is None:
        raise ProtocolError(ErrorCode.UNKNOWN_KIND, f"Unknown envelope kind {kind[:64]!r}.")
    try:
        return Kind(kind), model.model_validate(raw), raw
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


def leader_identity(build: str) -> dict[str, Any]:
    return {"version": PROTOCOL_VERSION, "build": build, "capabilities": sorted(LEADER_CAPABILITIES)}


def follower_identity(build: str) -> dict[str, Any]:
    return {"version": PROTOCOL_VERSION, "build": build, "capabilities": sorted({CAP_DELIVER, CAP_DISPLAY_TITLE})}


def ack(request_id: str, result: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    frame: dict[str, Any] = {"kind": Kind.ACK.value, "requestId": request_id, "ok": True}
    if result is not None:
        frame["result"] = result
    frame.update(extra)
    return frame


def error_ack(request_id: str, code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    frame = {"kind": Kind.ACK.value, "requestId": request_id, "ok": False,
             "error": {"code": code.value, "message": message}}
    frame.update(extra)
    return frame


def encode(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
