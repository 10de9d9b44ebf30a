"""The bus protocol's one definition (topicbus.protocol): decoding on both sides, builders, capabilities."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from pydantic import ValidationError

from topicbus.core import records
from topicbus.protocol import (
    CAP_BUTTON,
    CAP_BUTTONS,
    CAP_CONTROL,
    CAP_DELIVER,
    CAP_TAIL,
    CAP_DISPLAY_TITLE,
    CAP_EDIT,
    CAP_FORMAT,
    CAP_PHOTO,
    CAP_SCREEN_FRAMES,
    CAP_MEDIA,
    CAP_SEND,
    DELIVERY_CAPABILITIES,
    LEADER_CAPABILITIES,
    LEADER_V1_CAPABILITIES,
    MAX_DOCUMENT_BYTES,
    MAX_PID,
    SEND_FIELD_CAPABILITIES,
    Ack,
    Capabilities,
    ChatActionMessage,
    Deliver,
    DocumentMessage,
    ErrorCode,
    FollowerRequest,
    HeartbeatResult,
    Kind,
    ProtocolError,
    Receipt,
    Registration,
    RegistrationResult,
    SendRequest,
    SendResult,
    Superseded,
    TextMessage,
    ack,
    chat_action_message,
    check_compatibility,
    Disconnect,
    Heartbeat,
    decode_frame,
    decode_leader_frame,
    deliver_frame,
    disconnect_frame,
    document_message,
    encode,
    error_ack,
    follower_identity,
    leader_frame,
    heartbeat_frame,
    leader_identity,
    may_deliver,
    message_item,
    receipt_frame,
    register_frame,
    request_id_of,
    send_frame,
    superseded_frame,
    text_message,
    wire_item,
    wire_result,
)

SECRETISH = "value-that-must-not-be-echoed"


def decode(frame: dict[str, Any]) -> tuple[Kind, Any]:
    model = decode_frame(encode(frame))
    return model.kind, model


def refused(text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_frame(text)
    return info.value


def refused_by_follower(text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_leader_frame(text)
    return info.value


def heartbeat(**fields: Any) -> dict[str, Any]:
    return {**heartbeat_frame("r-1", "inst-1", "gen-1"), **fields}


def send(message: Any, **fields: Any) -> dict[str, Any]:
    return {**send_frame("r-1", "inst-1", "gen-1", {}), "message": message, **fields}


# --------------------------------------------------------------------------------------------------
# Follower → leader: builders round-trip through the leader's decode_frame
# --------------------------------------------------------------------------------------------------


def test_register_frame_round_trips() -> None:
    frame = register_frame("r-1", "inst-1", "gen-1", protocol=follower_identity("b"), pid=42,
                           process_birth_id="42:start:7", host_id="host", cwd="/repo", session_id="s",
                           name="agent", thread_name="Topic")
    kind, model = decode(frame)
    assert kind is Kind.REGISTER and isinstance(model, Registration)
    assert (model.request_id, model.instance_id, model.registration_generation) == ("r-1", "inst-1", "gen-1")
    assert (model.pid, model.process_birth_id, model.host_id) == (42, "42:start:7", "host")
    assert (model.cwd, model.session_id, model.name, model.thread_name) == ("/repo", "s", "agent", "Topic")
    assert check_compatibility(model.protocol) is None


def test_register_frame_leaves_out_absent_optional_fields() -> None:
    frame = register_frame("r-1", "inst-1", "gen-1", protocol=follower_identity("b"))
    assert set(frame) == {"kind", "requestId", "instanceId", "registrationGeneration", "protocol"}
    _, model = decode(frame)
    assert model.pid is None and model.cwd is None and model.name is None


@pytest.mark.parametrize("build, kind, model_type", [(heartbeat_frame, Kind.HEARTBEAT, Heartbeat),
                                                     (disconnect_frame, Kind.DISCONNECT, Disconnect)])
def test_generation_bound_frames_round_trip(build, kind: Kind, model_type: type[FollowerRequest]) -> None:
    decoded_kind, model = decode(build("r-2", "inst-1", "gen-9"))
    assert decoded_kind is kind and type(model) is model_type and isinstance(model, FollowerRequest)
    assert (model.request_id, model.instance_id, model.registration_generation) == ("r-2", "inst-1", "gen-9")


def test_send_frames_round_trip_for_every_message_type() -> None:
    cases = [
        (text_message("hello"), TextMessage, {"text": "hello"}),
        (chat_action_message(), ChatActionMessage, {"action": "typing"}),
        (document_message("r.txt", b"data", caption="cap"), DocumentMessage,
         {"file_name": "r.txt", "caption": "cap"}),
        (document_message("r.txt", b"data"), DocumentMessage, {"caption": None}),
    ]
    for message, model_type, expected in cases:
        kind, model = decode(send_frame("r-3", "inst-1", "gen-1", message))
        assert kind is Kind.SEND and isinstance(model, SendRequest)
        assert isinstance(model.message, model_type)
        for field, value in expected.items():
            assert getattr(model.message, field) == value
    _, model = decode(send_frame("r-3", "inst-1", "gen-1", document_message("r.txt", b"\x00\xff")))
    assert base64.b64decode(model.message.data_base64) == b"\x00\xff"


def test_receipt_frame_round_trips() -> None:
    kind, model = decode(receipt_frame("d-42"))
    assert kind is Kind.ACK and isinstance(model, Receipt) and model.request_id == "d-42" and model.ok


def test_unknown_fields_are_ignored_by_the_leader() -> None:
    _, model = decode(heartbeat(futureField={"a": [1, 2]}))
    assert model.instance_id == "inst-1"
    _, model = decode(send(text_message("x") | {"format": "markdown"}))
    assert model.message.text == "x"


# --------------------------------------------------------------------------------------------------
# Follower → leader: what the leader refuses
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("not json", "Frame is not valid JSON."),
    ("{", "Frame is not valid JSON."),
    ("[" * 100_000 + "]" * 100_000, "Frame is not valid JSON."),  # too deep to parse
    ('{"kind": "follower.register", "pid": ' + "9" * 5000 + "}", "Frame is not valid JSON."),  # int too long
    ('["follower.register"]', "Frame must be a JSON object."),
    ('"follower.register"', "Frame must be a JSON object."),
    ("{}", "Field 'kind' must be a string."),
    ('{"kind": 7}', "Field 'kind' must be a string."),
])
def test_unparseable_envelopes(text: str, message: str) -> None:
    err = refused(text)
    assert err.code is ErrorCode.INVALID_ENVELOPE and err.message == message


def test_unknown_kind_is_named_but_cut() -> None:
    err = refused(json.dumps({"kind": "leader.deliver", "requestId": "r"}))  # a leader kind, not a request
    assert err.code is ErrorCode.UNKNOWN_KIND and "leader.deliver" in err.message
    err = refused(json.dumps({"kind": "k" * 1000}))
    assert err.code is ErrorCode.UNKNOWN_KIND and len(err.message) < 100


@pytest.mark.parametrize("frame, field", [
    (heartbeat(instanceId=None), "instanceId"),
    ({"kind": "follower.heartbeat", "requestId": "r"}, "instanceId"),
    (heartbeat(requestId=7), "requestId"),
    (heartbeat(requestId=""), "requestId"),
    (heartbeat(registrationGeneration=5), "registrationGeneration"),
    (send(None), "message"),
    (send({"type": "text"}), "message.text.text"),
    (send({"type": "text", "text": 5}), "message.text.text"),
    (send({"type": "text", "text": ""}), "message.text.text"),
    (send({"type": "chatAction", "action": "Typing!"}), "message.chatAction.action"),
    (send(text_message("x"), chatId="-100"), "chatId"),
    (send(text_message("x"), threadId=True), "threadId"),
    ({"kind": "bus.ack", "requestId": "d-1", "ok": "yes"}, "ok"),
])
def test_missing_and_wrongly_typed_fields(frame: dict[str, Any], field: str) -> None:
    err = refused(encode(frame))
    assert err.code is ErrorCode.INVALID_ENVELOPE
    assert err.message.startswith("Invalid envelope: ") and f"{field}:" in err.message


def register_with(**fields: Any) -> dict[str, Any]:
    frame = register_frame("r-1", "inst-1", "gen-1", protocol=follower_identity("b"), pid=42)
    frame.update(fields)
    return frame


@pytest.mark.parametrize("frame, field", [
    (register_with(pid="42"), "pid"),
    (register_with(pid=True), "pid"),
    (register_with(pid=0), "pid"),
    (register_with(pid=MAX_PID + 1), "pid"),
    (register_with(slot="a"), "slot"),
    (register_with(target={"threadId": 1}), "target.chatId"),
    (register_with(protocol={"version": "1", "build": "b"}), "protocol.version"),
    (register_with(protocol={"version": 1, "build": "b", "capabilities": "deliver-v1"}), "protocol.capabilities"),
])
def test_registration_field_types(frame: dict[str, Any], field: str) -> None:
    err = refused(encode(frame))
    assert err.code is ErrorCode.INVALID_ENVELOPE and f"{field}:" in err.message


@pytest.mark.parametrize("frame, field", [
    (heartbeat(requestId="r" * 129), "requestId"),
    (heartbeat(instanceId="i" * 129), "instanceId"),
    (heartbeat(registrationGeneration="g" * 129), "registrationGeneration"),
    (register_with(cwd="c" * 4097), "cwd"),
    (register_with(sessionId="s" * 257), "sessionId"),
    (register_with(name="n" * 129), "name"),
    (register_with(hostId="h" * 257), "hostId"),
    (register_with(protocol={"version": 1, "build": "b", "capabilities": [CAP_DELIVER] * 33}),
     "protocol.capabilities"),
    (send(text_message("t" * 4097)), "message.text.text"),
    (send(document_message("f", b"x", caption="c" * 1025)), "message.document.caption"),
    (send(document_message("f" * 256, b"x")), "message.document.fileName"),
    (send(document_message("f", b"x" * (MAX_DOCUMENT_BYTES + 1))), "message.document.dataBase64"),
])
def test_oversized_fields(frame: dict[str, Any], field: str) -> None:
    err = refused(encode(frame))
    assert err.code is ErrorCode.INVALID_ENVELOPE and f"{field}:" in err.message


@pytest.mark.parametrize("data", ["not base64!", "", base64.b64encode(b"").decode()])
def test_documents_must_carry_valid_bytes(data: str) -> None:
    err = refused(encode(send({"type": "document", "fileName": "f", "dataBase64": data})))
    assert "message.document.dataBase64:" in err.message


def test_surrogates_are_refused_and_never_echoed() -> None:
    text = json.dumps(heartbeat(instanceId="\ud800"))  # JSON escapes it: "\\ud800"
    err = refused(text)
    assert err.code is ErrorCode.INVALID_ENVELOPE and "instanceId:" in err.message
    err.message.encode("utf-8")  # the answer itself is sendable
    assert request_id_of(json.dumps(heartbeat(requestId="a\udfffb"))) == "invalid"


def test_errors_never_echo_the_input() -> None:
    for frame in (send({"type": SECRETISH}), send({"type": "text", "text": 5, "x": SECRETISH}),
                  register_with(slot=SECRETISH), heartbeat(instanceId=[SECRETISH])):
        assert SECRETISH not in refused(encode(frame)).message


@pytest.mark.parametrize("text, expected", [
    (json.dumps(heartbeat(requestId="r-7", instanceId=None)), "r-7"),
    ("not json", "invalid"),
    ("[1]", "invalid"),
    (json.dumps({"requestId": 5}), "invalid"),
    (json.dumps({"requestId": ""}), "invalid"),
    (json.dumps({"requestId": "r" * 129}), "invalid"),
])
def test_request_id_of_failed_frames(text: str, expected: str) -> None:
    assert request_id_of(text) == expected


# --------------------------------------------------------------------------------------------------
# Leader → follower: builders round-trip through decode_leader_frame
# --------------------------------------------------------------------------------------------------


def test_registration_ack_round_trips() -> None:
    result = RegistrationResult(chat_id=-1001, thread_id=77, slot="A", display_title="A · x", binding_key="k")
    frame = decode_leader_frame(encode(ack("r-1", result.model_dump(by_alias=True), protocol=leader_identity("l"))))
    assert isinstance(frame, Ack) and frame.ok and frame.request_id == "r-1"
    assert frame.result_as(RegistrationResult) == result
    assert frame.protocol is not None and Capabilities.of(frame.protocol.capabilities) == Capabilities.of(
        LEADER_CAPABILITIES)


def test_error_ack_round_trips() -> None:
    frame = decode_leader_frame(encode(error_ack("r-1", ErrorCode.STALE_GENERATION, "Stale.")))
    assert isinstance(frame, Ack) and not frame.ok
    assert (frame.error_code, frame.error_message) == ("stale-generation", "Stale.")
    bare = decode_leader_frame(json.dumps({"kind": "bus.ack", "requestId": "r", "ok": False}))
    assert (bare.error_code, bare.error_message) == ("unknown", "")


def test_results_are_read_strictly() -> None:
    def ack_with(result: Any) -> Ack:
        return decode_leader_frame(encode(ack("r", result)))

    assert ack_with({"chatId": -1, "threadId": 2, "slot": "B"}).result_as(RegistrationResult) == RegistrationResult(
        chat_id=-1, thread_id=2, slot="B")
    for bad in ({"chatId": "-1", "threadId": 2, "slot": "B"}, {"chatId": -1, "threadId": True, "slot": "B"},
                {"chatId": -1, "threadId": None, "slot": "B"}, {"chatId": -1, "threadId": 2}, None):
        assert ack_with(bad).result_as(RegistrationResult) is None
    assert ack_with({"displayTitle": "T"}).result_as(HeartbeatResult) == HeartbeatResult(display_title="T")
    assert ack_with(None).result_as(HeartbeatResult) == HeartbeatResult()
    assert ack_with({"displayTitle": None}).result_as(HeartbeatResult) == HeartbeatResult()
    assert ack_with({"outboxId": 9}).result_as(SendResult) == SendResult(outbox_id=9)
    assert ack_with({"outboxId": "9"}).result_as(SendResult) is None


def test_deliver_round_trips() -> None:
    document = {"fileId": "F", "fileName": "r.txt", "mimeType": "text/plain", "fileSize": 4}
    item = message_item(text=None, caption="cap", messageId=17, fromUserId=1, fromName="Ada", date=1764474000,
                        document=document)
    assert set(item) == {"type", "text", "caption", "messageId", "fromUserId", "fromName", "date", "document", "reply"}
    frame = decode_leader_frame(encode(deliver_frame("d-1", "inst-1", "gen-1", item)))
    assert isinstance(frame, Deliver) and frame.id == "d-1"
    assert (frame.instance_id, frame.registration_generation) == ("inst-1", "gen-1")
    got = frame.item
    assert (got.type, got.text, got.caption, got.message_id, got.from_user_id, got.from_name, got.date) == (
        "message", None, "cap", 17, 1, "Ada", 1764474000)
    assert got.document is not None and got.document.model_dump(by_alias=True) == document


def test_deliver_without_delivery_id_uses_the_request_id() -> None:
    raw = {"kind": "leader.deliver", "requestId": "d-3", "item": {"type": "message", "text": "x"}}
    assert decode_leader_frame(json.dumps(raw)).id == "d-3"


def test_message_item_builder_validates() -> None:
    with pytest.raises(ValidationError):
        message_item(text=5)


def test_superseded_round_trips() -> None:
    frame = decode_leader_frame(encode(superseded_frame("inst-1", "newer registration")))
    assert isinstance(frame, Superseded)
    assert (frame.instance_id, frame.reason) == ("inst-1", "newer registration")


def test_follower_ignores_unknown_fields_everywhere() -> None:
    raw = deliver_frame("d-1", "i", "g", message_item(text="hi") | {"replyTo": {"messageId": 1}})
    raw["priority"] = "high"
    raw["item"]["document"] = {"fileId": "F", "width": 10}
    frame = decode_leader_frame(json.dumps(raw))
    assert frame.item.text == "hi" and frame.item.document.file_id == "F"
    reply = ack("r", {"chatId": 1, "threadId": 2, "slot": "A", "newField": 1},
                protocol={"version": 1, "build": "later", "capabilities": [f"cap-{i}" for i in range(64)],
                          "extra": True})
    parsed = decode_leader_frame(encode(reply))
    assert parsed.result_as(RegistrationResult) is not None
    assert len(parsed.protocol.capabilities) == 64  # a later leader may advertise many


@pytest.mark.parametrize("frame, field", [
    ({"kind": "bus.ack", "requestId": "r", "ok": "yes"}, "ok"),
    ({"kind": "bus.ack", "requestId": "r"}, "ok"),
    ({"kind": "bus.ack", "requestId": "r", "ok": False, "error": {"message": "m"}}, "error.code"),
    ({"kind": "bus.ack", "requestId": "r", "ok": True, "result": [1]}, "result"),
    ({"kind": "bus.ack", "requestId": "r", "ok": True, "protocol": {"version": "1", "build": "b"}}, "protocol.version"),
    (deliver_frame("d", "i", "g", {"type": "message", "text": 5}), "item.message.text"),
    (deliver_frame("d", "i", "g", {"type": "message", "messageId": True}), "item.message.messageId"),
    (deliver_frame("d", "i", "g", {"type": "message", "document": {"fileSize": "4"}}), "item.message.document.fileSize"),
    (deliver_frame("d", "i", "g", {"type": "teleport", "text": "x"}), "item"),
    (deliver_frame("d", "i", "g", {"type": "edit", "text": "x"}), "item.edit.messageId"),
    (deliver_frame("d", "i", "g", {"text": "x"}), "item"),
    ({"kind": "leader.deliver", "requestId": "d"}, "item"),
    (deliver_frame("d" * 129, "i", "g", message_item(text="x")), "requestId"),
    (deliver_frame("", "i", "g", message_item(text="x")), "requestId"),
    (deliver_frame("d", "i", "g", message_item(text="x")) | {"deliveryId": 7}, "deliveryId"),
    (deliver_frame("d", "i", "g", {"type": "message", "text": "\ud800"}), "item.message.text"),
    ({"kind": "leader.superseded", "reason": 5}, "reason"),
])
def test_follower_refuses_wrong_types_of_known_fields(frame: dict[str, Any], field: str) -> None:
    err = refused_by_follower(json.dumps(frame))
    assert err.code is ErrorCode.INVALID_ENVELOPE and f"{field}:" in err.message
    assert "'edit'" not in err.message  # the offending tag is not echoed


def test_follower_refuses_unknown_kinds_and_garbage() -> None:
    assert refused_by_follower("nope").code is ErrorCode.INVALID_ENVELOPE
    assert refused_by_follower("[]").code is ErrorCode.INVALID_ENVELOPE
    for kind in ("leader.somethingNew", "follower.register"):
        assert refused_by_follower(json.dumps({"kind": kind, "requestId": "r"})).code is ErrorCode.UNKNOWN_KIND


# --------------------------------------------------------------------------------------------------
# Protocol identity and capabilities
# --------------------------------------------------------------------------------------------------


def test_identities() -> None:
    assert follower_identity("b") == {"version": 1, "build": "b", "capabilities": [CAP_DELIVER, CAP_DISPLAY_TITLE]}
    assert leader_identity("l")["capabilities"] == sorted({CAP_DELIVER, CAP_SEND, CAP_FORMAT, CAP_PHOTO, CAP_BUTTONS, CAP_TAIL,
                                                           CAP_SCREEN_FRAMES})
    assert leader_identity("l", [CAP_FORMAT, CAP_SEND, CAP_SEND])["capabilities"] == [CAP_FORMAT, CAP_SEND]
    assert follower_identity("b", Capabilities.for_follower(["message", "edit"]))["capabilities"] == [
        CAP_DELIVER, CAP_DISPLAY_TITLE, CAP_EDIT]


@pytest.mark.parametrize("protocol, reason", [
    (None, "missing-identity"),
    ({"version": 2, "build": "b", "capabilities": [CAP_DELIVER]}, "version-mismatch"),
    ({"version": 1, "build": "b", "capabilities": [CAP_SEND]}, "missing-capability"),
    ({"version": 1, "build": "b", "capabilities": [CAP_DELIVER, "from-the-future-v9"]}, None),
])
def test_compatibility(protocol: dict[str, Any] | None, reason: str | None) -> None:
    frame = register_frame("r", "i", "g", protocol=protocol or {})
    if protocol is None:
        del frame["protocol"]
    _, model = decode(frame)
    assert check_compatibility(model.protocol) == reason


def test_capability_names() -> None:
    assert dict(DELIVERY_CAPABILITIES) == {"control": CAP_CONTROL, "button": CAP_BUTTON, "edit": CAP_EDIT,
                                           "media": CAP_MEDIA}
    assert dict(SEND_FIELD_CAPABILITIES) == {"format": CAP_FORMAT, "buttons": CAP_BUTTONS, "tail": CAP_TAIL,
                                             "screen": CAP_SCREEN_FRAMES}
    names = [CAP_DELIVER, CAP_DISPLAY_TITLE, CAP_SEND, *DELIVERY_CAPABILITIES.values(),
             *SEND_FIELD_CAPABILITIES.values()]
    assert len(set(names)) == len(names) and all(n.endswith("-v1") for n in names)


def test_followers_advertise_the_types_they_receive() -> None:
    assert Capabilities.for_follower() == Capabilities(frozenset({CAP_DELIVER, CAP_DISPLAY_TITLE}))
    every = Capabilities.for_follower(["message", *DELIVERY_CAPABILITIES])
    assert every.names == {CAP_DELIVER, CAP_DISPLAY_TITLE, *DELIVERY_CAPABILITIES.values()}
    with pytest.raises(ValueError, match="unknown delivery type"):
        Capabilities.for_follower(["hologram"])


def test_may_receive() -> None:
    nothing = Capabilities()
    assert nothing.may_receive("message")  # every follower receives messages
    for item_type, capability in DELIVERY_CAPABILITIES.items():
        assert not nothing.may_receive(item_type)
        assert not Capabilities.of(set(DELIVERY_CAPABILITIES.values()) - {capability}).may_receive(item_type)
        assert Capabilities.of([capability]).may_receive(item_type)
    assert not Capabilities.of(["hologram-v1", *DELIVERY_CAPABILITIES.values()]).may_receive("hologram")


def test_may_deliver_on_the_leader_side() -> None:
    old_follower = frozenset({CAP_DELIVER, CAP_DISPLAY_TITLE})  # as FollowerRecord.capabilities holds them
    assert may_deliver(records.MessageItem(text="hi"), old_follower)
    assert not may_deliver(records.EditItem(1, "changed"), old_follower)  # never on an old follow's stdin
    assert may_deliver(records.EditItem(1, "changed"), old_follower | {CAP_EDIT})
    assert may_deliver(records.ControlItem("interrupt"), Capabilities.of([CAP_CONTROL]))
    assert not may_deliver(records.UnknownItem("teleport"), old_follower | set(DELIVERY_CAPABILITIES.values()))


def test_a_screen_control_goes_only_to_a_follower_that_takes_screenshots() -> None:
    from topicbus.protocol import CAP_SCREEN, CONTROL_ACTION_CAPABILITIES

    assert dict(CONTROL_ACTION_CAPABILITIES) == {"screen": CAP_SCREEN} and CAP_SCREEN == "screen-v1"
    screen = records.ControlItem("screen")
    assert not may_deliver(screen, Capabilities.of([CAP_DELIVER, CAP_CONTROL]))  # follow without --pty, an SDK client
    assert not may_deliver(screen, Capabilities.of([CAP_DELIVER, CAP_SCREEN]))  # controls need control-v1 too
    assert may_deliver(screen, Capabilities.of([CAP_DELIVER, CAP_CONTROL, CAP_SCREEN]))  # follow --pty
    for action in ("interrupt", "kill", "eof"):  # version 1's actions need nothing more
        assert may_deliver(records.ControlItem(action), Capabilities.of([CAP_CONTROL]))
    # A follower that advertised it decodes the item (an older one never receives it).
    frame = decode_leader_frame(encode(leader_frame(records.Deliver("c-u1", "i", "g", screen))))
    assert frame.item.action == "screen"


def test_send_fields() -> None:
    v1 = Capabilities.of(LEADER_V1_CAPABILITIES)
    assert v1.accepts_send_field("text", "text") and v1.accepts_send_field("action", "chatAction")
    assert v1.accepts_send_field("caption", "document") and v1.accepts_send_field("type", "anything")
    assert not v1.accepts_send_field("action", "text")  # another type's field is not this type's
    assert not v1.accepts_send_field("format", "text") and not v1.accepts_send_field("buttons", "text")
    later = Capabilities.of([*LEADER_V1_CAPABILITIES, CAP_FORMAT])
    assert later.accepts_send_field("format", "text") and not later.accepts_send_field("buttons", "text")
    assert not Capabilities.of(["anything-v1"]).accepts_send_field("anything", "text")


def test_unsupported_send_fields() -> None:
    v1 = Capabilities.of(LEADER_V1_CAPABILITIES)
    for message in (text_message("x"), chat_action_message(), document_message("f", b"x", caption="c")):
        assert v1.unsupported_send_fields(message) == []
        assert Capabilities().unsupported_send_fields(message) == []  # version 1 fields need nothing
    fancy = text_message("x") | {"format": "markdown", "buttons": [], "zzz": 1}
    assert v1.unsupported_send_fields(fancy) == ["buttons", "format", "zzz"]
    assert Capabilities.of([CAP_FORMAT, CAP_BUTTONS]).unsupported_send_fields(fancy) == ["zzz"]
    assert v1.unsupported_send_fields(text_message("x") | {"format": None}) == []  # null asks for nothing
    photo = document_message("p.png", b"x", caption="c") | {"type": "photo"}
    assert v1.unsupported_send_fields(photo) == ["caption", "dataBase64", "fileName", "type"]  # a type v1 lacks
    assert Capabilities.of([CAP_PHOTO]).unsupported_send_fields(photo) == []
    assert Capabilities.of([CAP_PHOTO]).unsupported_send_fields(photo | {"url": "u"}) == ["url"]


def test_capabilities_value_type() -> None:
    caps = Capabilities.of([CAP_SEND, CAP_DELIVER, CAP_SEND])
    assert CAP_SEND in caps and CAP_FORMAT not in caps
    assert caps.as_list() == [CAP_DELIVER, CAP_SEND]
    assert Capabilities.of(caps) is caps and Capabilities.of(None) == Capabilities()
    assert hash(caps) == hash(Capabilities.of([CAP_DELIVER, CAP_SEND]))


def test_a_screen_frame_is_sent_only_to_a_leader_that_advertised_screen_frames() -> None:
    frame = {"type": "text", "text": "top - 10:00", "format": "pre", "screen": True}
    assert CAP_SCREEN_FRAMES == "screen-frames-v1"
    assert Capabilities.of([CAP_FORMAT]).unsupported_send_fields(frame) == ["screen"]
    assert Capabilities.of([CAP_FORMAT, CAP_SCREEN_FRAMES]).unsupported_send_fields(frame) == []
    request = decode_frame(json.dumps(send_frame("r1", "i1", "g1", frame)))
    assert isinstance(request, SendRequest) and request.message.screen is True


# --------------------------------------------------------------------------------------------------
# The leader's records ⇄ the wire: one converter each way
# --------------------------------------------------------------------------------------------------

VOICE = records.FileRef(file_id="F", file_name="v.ogg", mime_type="audio/ogg", file_size=9, kind="voice", duration=3)
REPLY = records.ReplyContext(message_id=5, text="q", from_name="Bot", from_agent=True, quote="q")
ITEMS = [
    records.MessageItem(text="hi", message_id=1, from_user_id=2, from_name="Ada", date=3, reply=REPLY),
    records.MessageItem(caption="c", document=records.DocumentRef("F", "r.txt", "text/plain", 4)),
    records.MessageItem(text="spoken", transcribed_from=VOICE),
    records.MediaItem(files=(VOICE, records.FileRef(file_id="G", kind="photo", too_large=True)), caption="c",
                      message_id=1, from_user_id=2, from_name="Ada", date=3, reply=REPLY),
    records.EditItem(message_id=1, text="better"),
    records.ControlItem("interrupt", message_id=7),
    records.ButtonItem("yes", message_id=7, from_user_id=2),
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: item.type)
def test_a_delivered_record_is_the_wire_item_its_model_reads(item: records.InboundItem) -> None:
    frame = decode_leader_frame(encode(leader_frame(records.Deliver("d-1", "inst-1", "gen-1", item))))
    assert isinstance(frame, Deliver) and (frame.id, frame.instance_id, frame.registration_generation) == (
        "d-1", "inst-1", "gen-1")
    expected = frame.item.model_dump(by_alias=True)
    if isinstance(item, records.MessageItem) and item.transcribed_from is None:
        del expected["transcribedFrom"]  # only a transcribed message has the field (transcript-v1)
    assert wire_item(item) == expected


def test_an_item_no_follower_takes_is_never_put_on_the_wire() -> None:
    with pytest.raises(ValueError):
        wire_item(records.UnknownItem("teleport"))


def test_a_supersession_is_the_frame_followers_read() -> None:
    frame = decode_leader_frame(encode(leader_frame(records.Superseded("inst-1", "newer"))))
    assert isinstance(frame, Superseded) and (frame.instance_id, frame.reason) == ("inst-1", "newer")


def test_answers_are_the_results_followers_read() -> None:
    answer = records.RegistrationResult(chat_id=-1, thread_id=7, slot="B", display_title="B · x", binding_key="k")
    assert wire_result(answer) == RegistrationResult(chat_id=-1, thread_id=7, slot="B", display_title="B · x",
                                                     binding_key="k").model_dump(by_alias=True)
    assert wire_result(records.HeartbeatResult("T")) == {"displayTitle": "T"}
    assert wire_result(records.HeartbeatResult(None)) == {"displayTitle": None}
    assert wire_result(records.SendResult(9)) == {"outboxId": 9}
    assert wire_result(None) == {}  # a disconnect's answer


def test_a_send_message_becomes_its_outbox_item() -> None:
    def item(message: dict[str, Any]) -> records.OutboxItem:
        request = decode_frame(encode(send_frame("r", "i", "g", message)))
        assert isinstance(request, SendRequest)
        return request.item

    assert item(text_message("x")) == records.TextMessage("x")
    fancy = text_message("x") | {"format": "pre", "tail": True, "screen": False,
                                 "buttons": [[{"text": "Yes", "data": "y"}, {"text": "No", "data": "n"}]]}
    assert item(fancy) == records.TextMessage("x", "pre", ((records.Button("Yes", "y"), records.Button("No", "n")),),
                                              tail=True, screen=False)
    assert item(chat_action_message("upload_photo")) == records.ChatActionMessage("upload_photo")
    assert item(document_message("r.txt", b"\x00\xff", caption="c")) == records.DocumentMessage("r.txt", b"\x00\xff",
                                                                                                "c")
    photo = document_message("p.png", b"png") | {"type": "photo"}
    assert item(photo) == records.PhotoMessage("p.png", b"png")
