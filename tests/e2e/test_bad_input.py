"""Bad input end to end: each gets a clear error and changes nothing.

A real ``topicbus leader`` subprocess against the fake Bot API, spoken to with raw WebSocket
clients (no follower library in between), raw Telegram updates and broken environments.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from topicbus.leader.notices import GENERAL_HINT, TOPIC_HINT
from tests.e2e.harness import (CHAT_ID, OWNER_ID, RECORDING_AGENT, SECRET, Cluster, RawBus, recorded_lines,
                               register_frame)

pytestmark = pytest.mark.e2e

KNOWN_KINDS = frozenset({"follower.register", "follower.heartbeat", "follower.disconnect", "follower.send",
                         "bus.ack"})
TELEGRAM_EFFECTS = ("sendMessage", "sendDocument", "sendChatAction", "createForumTopic", "deleteForumTopic",
                    "closeForumTopic")
MAX_PID = 2**31 - 1
FRAME_LIMIT = 1 << 20
INVALID_ENVELOPE = frozenset({"invalid-envelope"})

# --------------------------------------------------------------------------------------------------
# Frame model: what is sent, and what the one ack for it must say
# --------------------------------------------------------------------------------------------------

RID = "@@fresh-request-id@@"
RID_JSON = json.dumps(RID)
SAME_AS_FIRST = frozenset({"<same answer as the first frame of the step>"})


@dataclass(frozen=True)
class Bad:
    """One frame. ``text`` may contain ``RID_JSON``, replaced at send time by a fresh request id."""

    text: str
    codes: frozenset[str]
    rid: str | None  # the requestId the ack must carry: None = the fresh id

    def __repr__(self) -> str:  # keep hypothesis' falsifying examples readable
        shown = self.text if len(self.text) < 300 else f"{self.text[:200]}…<{len(self.text)} chars>"
        return f"Bad({shown!r}, {sorted(self.codes)}, rid={self.rid!r})"


@dataclass(frozen=True)
class Step:
    """Frames that share one fresh request id (a replay step sends the same id several times)."""

    frames: tuple[Bad, ...]


def _valid_rid(value: Any) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= 128:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def expected_rid(obj: Any) -> str | None:
    """docs/protocol.md: the ack echoes a usable requestId, else says ``"invalid"``."""
    value = obj.get("requestId") if isinstance(obj, dict) else None
    if value == RID:
        return None
    return value if _valid_rid(value) else "invalid"


def bad(obj: Any, codes: frozenset[str], pad: str = "") -> Bad:
    text = json.dumps(obj)
    if pad:
        assert text.endswith("}")
        text = text[:-1] + ',"padding":' + pad + "}"
    return Bad(text, codes, expected_rid(obj))


def single(obj: Any, codes: frozenset[str], pad: str = "") -> Step:
    return Step((bad(obj, codes, pad),))


# --------------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------------

MISSING = object()  # "drop this field"
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
surrogates = st.sampled_from(["\ud800", "a\udfffb", "\udc00" * 3])  # JSON "\\ud800": not UTF-8 text
huge_ascii = st.integers(min_value=4_097, max_value=900_000).map(lambda n: "h" * n)


def non_null(pred) -> st.SearchStrategy[Any]:
    return json_values.filter(lambda v: v is not None and pred(v))


def not_str() -> st.SearchStrategy[Any]:
    return non_null(lambda v: not isinstance(v, str))


def not_int() -> st.SearchStrategy[Any]:
    return non_null(lambda v: isinstance(v, bool) or not isinstance(v, int))


def too_long(limit: int) -> st.SearchStrategy[str]:
    return st.integers(min_value=limit + 1, max_value=max(limit + 1, 900_000)).map(lambda n: "L" * n)


def bad_text(max_len: int, *, min_len: int = 1, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Values a (nullable) length-limited string field must refuse."""
    options = [not_str(), too_long(max_len), surrogates]
    if min_len:
        options.append(st.just(""))
    if not nullable:
        options.append(st.none())
    return st.one_of(options)


bad_id = bad_text(128, nullable=False)
bad_generation = st.one_of(not_str(), too_long(128), surrogates)
bad_pid = st.one_of(not_int(), st.integers(max_value=0), st.integers(min_value=MAX_PID + 1))
bad_optional_int = not_int()
bad_slot = st.one_of(not_str(), st.text(max_size=3).filter(lambda s: re.fullmatch("[A-Z]", s) is None))
bad_target = st.one_of(
    non_null(lambda v: not isinstance(v, dict)),
    st.fixed_dictionaries({"threadId": st.integers()}),
    st.fixed_dictionaries({"chatId": not_int()}),
    st.fixed_dictionaries({"chatId": st.integers(), "threadId": bad_optional_int}),
)
bad_protocol = st.one_of(
    non_null(lambda v: not isinstance(v, dict)),
    st.just({}),
    st.fixed_dictionaries({"version": not_int(), "build": st.just("b")}),
    st.fixed_dictionaries({"version": st.just(1), "build": bad_text(128, nullable=False)}),
    st.fixed_dictionaries({"version": st.just(1), "build": st.just("b"),
                           "capabilities": non_null(lambda v: not isinstance(v, list))}),
    st.fixed_dictionaries({"version": st.just(1), "build": st.just("b"),
                           "capabilities": st.lists(st.just("deliver-v1"), min_size=33, max_size=40)}),
    st.fixed_dictionaries({"version": st.just(1), "build": st.just("b"),
                           "capabilities": st.tuples(bad_text(128, nullable=False)).map(list)}),
)
not_base64 = st.one_of(
    st.text(min_size=1, max_size=40).filter(lambda s: not _is_base64(s)),
    st.just(""),  # decodes to nothing: an empty document
    st.just(base64.b64encode(b"\0" * (512 * 1024 + 1)).decode()),
)


def _is_base64(text: str) -> bool:
    try:
        return bool(base64.b64decode(text, validate=True))
    except ValueError:
        return False


bad_message = st.one_of(
    non_null(lambda v: not isinstance(v, dict)),
    st.fixed_dictionaries({"type": json_values.filter(lambda v: v not in ("text", "chatAction", "document"))
                           | huge_ascii, "text": st.just("x")}),
    st.just({"type": "text"}),
    st.fixed_dictionaries({"type": st.just("text"), "text": bad_text(4096, nullable=False)}),
    st.fixed_dictionaries({"type": st.just("chatAction"),
                           "action": st.one_of(not_str(), st.none(), st.text(max_size=40).filter(
                               lambda s: re.fullmatch("[a-z_]{1,32}", s) is None))}),
    st.fixed_dictionaries({"type": st.just("document"), "dataBase64": st.just("eA==")}),
    st.fixed_dictionaries({"type": st.just("document"), "fileName": bad_text(255, nullable=False),
                           "dataBase64": st.just("eA==")}),
    st.fixed_dictionaries({"type": st.just("document"), "fileName": st.just("f.txt"), "dataBase64": not_base64}),
    st.fixed_dictionaries({"type": st.just("document"), "fileName": st.just("f.txt"), "dataBase64": st.just("eA=="),
                           "caption": st.one_of(not_str(), too_long(1024))}),
)
valid_message = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(min_size=1, max_size=50)),
    st.just({"type": "chatAction", "action": "typing"}),
    st.just({"type": "document", "fileName": "notes.txt", "dataBase64": base64.b64encode(b"hello").decode()}),
)
# Extra (ignored) padding on a valid envelope: big strings and moderately deep nesting.
padding = st.one_of(
    st.just(""),
    st.integers(min_value=1, max_value=900_000).map(lambda n: json.dumps("p" * n)),
    st.integers(min_value=1, max_value=400).map(lambda d: "[" * d + "]" * d),
    st.integers(min_value=1, max_value=200).map(lambda d: '{"a":' * d + "0" + "}" * d),
)

# Field → strategy of values that field must refuse, per kind. Templates are built so that even a
# frame that (wrongly) passed validation could never register or post anything.
FIELD_BREAKERS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "follower.register": {
        "requestId": bad_id, "instanceId": bad_id, "registrationGeneration": bad_generation, "pid": bad_pid,
        "processBirthId": bad_text(256, min_len=0), "hostId": bad_text(256, min_len=0),
        "cwd": bad_text(4096), "sessionId": bad_text(256), "name": bad_text(128), "profileKey": bad_text(512),
        "threadName": bad_text(128), "slot": bad_slot, "target": bad_target, "protocol": bad_protocol,
    },
    "follower.heartbeat": {"requestId": bad_id, "instanceId": bad_id, "registrationGeneration": bad_generation},
    "follower.disconnect": {"requestId": bad_id, "instanceId": bad_id, "registrationGeneration": bad_generation},
    "follower.send": {"requestId": bad_id, "instanceId": bad_id, "registrationGeneration": bad_generation,
                      "message": bad_message, "chatId": bad_optional_int, "threadId": bad_optional_int},
    "bus.ack": {"requestId": bad_id, "ok": non_null(lambda v: not isinstance(v, bool)) | st.none()},
}
REQUIRED = {
    "follower.register": ("requestId", "instanceId"),
    "follower.heartbeat": ("requestId", "instanceId"),
    "follower.disconnect": ("requestId", "instanceId"),
    "follower.send": ("requestId", "instanceId", "message"),
    "bus.ack": ("requestId",),
}


def template(kind: str) -> dict[str, Any]:
    ghost = f"ghost-{uuid.uuid4().hex}"  # never registered: a frame that slipped through is refused
    if kind == "follower.register":
        frame = register_frame("/tmp/never-registered", requestId=RID, instanceId=ghost)
        frame["protocol"] = {"version": 999, "build": "b", "capabilities": ["deliver-v1"]}  # incompatible
        return frame
    if kind == "bus.ack":
        return {"kind": kind, "requestId": RID, "ok": True}
    frame = {"kind": kind, "requestId": RID, "instanceId": ghost, "registrationGeneration": "g"}
    if kind == "follower.send":
        frame["message"] = {"type": "text", "text": "never posted"}
    return frame


@st.composite
def invalid_envelopes(draw) -> Step:
    """A known kind with one required field missing or one field of a wrong type / size."""
    kind = draw(st.sampled_from(sorted(KNOWN_KINDS)))
    frame = template(kind)
    if draw(st.booleans()):
        del frame[draw(st.sampled_from(REQUIRED[kind]))]
    else:
        field = draw(st.sampled_from(sorted(FIELD_BREAKERS[kind])))
        frame[field] = draw(FIELD_BREAKERS[kind][field])
    return single(frame, INVALID_ENVELOPE)


garbage_text = st.text(st.characters(codec="utf-8"), max_size=60).filter(
    lambda t: not isinstance(_loads(t), dict))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def raw_step(text: str) -> Step:
    return Step((Bad(text, INVALID_ENVELOPE, "invalid"),))


unparseable = st.one_of(
    garbage_text.map(raw_step),
    st.integers(min_value=5_000, max_value=100_000).map(lambda d: raw_step("[" * d + "]" * d)),
    st.integers(min_value=5_000, max_value=100_000).map(lambda d: raw_step('{"a":' * d + "1" + "}" * d)),
    st.integers(min_value=5_000, max_value=100_000).map(
        lambda d: raw_step('{"kind":"follower.heartbeat","requestId":"deep","instanceId":' + "[" * d + "]" * d
                           + "}")),
    st.builds(lambda t: raw_step(t[: len(t) // 2]), st.just(json.dumps(template("follower.send")))),
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: raw_step(json.dumps(v))),
)
kindless = st.builds(
    lambda extra, kind, rid: single({**extra, **({} if kind is MISSING else {"kind": kind}),
                                     **({} if rid is MISSING else {"requestId": rid})}, INVALID_ENVELOPE),
    st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("kind", "requestId")), json_values, max_size=3),
    st.just(MISSING) | not_str(),
    st.sampled_from([MISSING, RID]) | json_values,
)
unknown_kinds = st.one_of(
    st.builds(lambda kind, pad: single({"kind": kind, "requestId": RID, "instanceId": "x"},
                                       frozenset({"unknown-kind"}), pad),
              st.sampled_from(["leader.deliver", "leader.superseded", "FOLLOWER.REGISTER", "follower.register ", "",
                               "bus.nack"]) | st.text(max_size=30).filter(lambda k: k not in KNOWN_KINDS),
              padding),
    huge_ascii.map(lambda kind: single({"kind": kind, "requestId": RID}, frozenset({"unknown-kind"}))),
)


def domain_refusals(a: dict[str, Any], a_target: dict[str, Any], b_target: dict[str, Any]) -> st.SearchStrategy[
        tuple[dict[str, Any], frozenset[str]]]:
    """Well-formed envelopes the runtime must refuse (A and B are live followers)."""
    live_ids = {a["instanceId"]}
    ghost_id = st.text(st.characters(codec="utf-8"), min_size=1, max_size=128).filter(lambda s: s not in live_ids)
    stale_gen = st.sampled_from([MISSING, None, ""]) | st.text(max_size=128).filter(
        lambda g: g != a["registrationGeneration"])
    fenced_kind = st.sampled_from(["follower.heartbeat", "follower.disconnect", "follower.send"])
    own_chat, own_thread = a_target["chatId"], a_target["threadId"]
    foreign = st.one_of(
        st.just({"chatId": b_target["chatId"], "threadId": b_target["threadId"]}),
        st.just({"threadId": b_target["threadId"]}),
        st.integers().filter(lambda c: c != own_chat).map(lambda c: {"chatId": c}),
        st.integers().filter(lambda t: t != own_thread).map(lambda t: {"chatId": own_chat, "threadId": t}),
    )

    def fenced(kind: str, instance: str, generation: Any, message: dict[str, Any]) -> dict[str, Any]:
        frame = {"kind": kind, "requestId": RID, "instanceId": instance}
        if generation is not MISSING:
            frame["registrationGeneration"] = generation
        if kind == "follower.send":
            frame["message"] = message
        return frame

    def reg(**fields: Any) -> dict[str, Any]:
        frame = register_frame(f"/tmp/refused-{uuid.uuid4().hex[:8]}", requestId=RID)
        for key, value in fields.items():
            if value is MISSING:
                frame.pop(key, None)
            else:
                frame[key] = value
        return frame

    unknown = st.builds(lambda k, i, m: (fenced(k, i, "g", m), frozenset({"unknown-instance"})),
                        fenced_kind, ghost_id, valid_message)
    stale = st.builds(lambda k, g, m: (fenced(k, a["instanceId"], g, m), frozenset({"stale-generation"})),
                      fenced_kind, stale_gen, valid_message)
    foreign_send = st.builds(
        lambda t, m: ({**fenced("follower.send", a["instanceId"], a["registrationGeneration"], m), **t},
                      frozenset({"foreign-target"})), foreign, valid_message)
    incompatible = st.builds(
        lambda p: (reg(protocol=p), frozenset({"incompatible-protocol"})),
        st.sampled_from([MISSING, {"version": 2, "build": "b", "capabilities": ["deliver-v1"]},
                         {"version": 1, "build": "b", "capabilities": []},
                         {"version": 1, "build": "b", "capabilities": ["send-v1", "something-else"]}])
        | st.integers().filter(lambda v: v != 1).map(
            lambda v: {"version": v, "build": "b", "capabilities": ["deliver-v1"]}))
    no_generation = st.builds(lambda g: (reg(registrationGeneration=g), frozenset({"missing-generation"})),
                              st.sampled_from([MISSING, None, ""]))
    relative = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() and not s.strip().startswith("/"))
    bad_identity = st.builds(lambda fields: (reg(**fields), INVALID_ENVELOPE), st.one_of(
        relative.map(lambda c: {"cwd": c}),
        st.just({"cwd": "/tmp/nul\0inside"}),
        st.just({"hostId": "host\0id"}),
        st.just({"cwd": MISSING, "name": MISSING, "sessionId": "\0"}),
    ))
    return st.one_of(unknown, stale, foreign_send, incompatible, no_generation, bad_identity)


def steps(a: dict[str, Any], a_target: dict[str, Any], b_target: dict[str, Any],
          used_ids: list[str]) -> st.SearchStrategy[Step]:
    """``used_ids``: request ids of requests that already *succeeded* on the barrage socket."""
    refusals = domain_refusals(a, a_target, b_target)
    refused = st.builds(lambda r, pad: single(r[0], r[1], pad), refusals, padding)

    def replay(first: tuple[dict[str, Any], frozenset[str]], other: tuple[dict[str, Any], frozenset[str]],
               used: str) -> Step:
        # A refused request changed nothing: the same frame again is refused the same way. A
        # different payload under the id of a request that succeeded is a collision.
        x = bad(first[0], first[1])
        changed = {**other[0], "requestId": used}
        return Step((x, Bad(x.text, SAME_AS_FIRST, None),
                     Bad(json.dumps(changed), frozenset({"request-id-collision"}), used)))

    replays = st.builds(replay, refusals, refusals, st.sampled_from(used_ids))
    # one_of picks branches uniformly: the runtime refusals are listed twice to weigh them up.
    return st.one_of(unparseable, kindless, unknown_kinds, invalid_envelopes(), refused, refused, replays)


def checklist(a: dict[str, Any], b_target: dict[str, Any], used_ids: list[str]) -> list[Step]:
    """The cases of the issue, each sent on every run (as a hypothesis ``@example``)."""
    fenced = {"instanceId": a["instanceId"], "registrationGeneration": a["registrationGeneration"], "requestId": RID}
    text = {"type": "text", "text": "to B's topic"}
    deep = 10_000
    return [
        raw_step("{not json"),
        raw_step("[" * deep + "]" * deep),
        raw_step('{"kind":"follower.send","requestId":"x","message":' + "[" * deep + "]" * deep + "}"),
        single([1, 2, 3], INVALID_ENVELOPE),
        single({"requestId": RID}, INVALID_ENVELOPE),
        single({"kind": 7, "requestId": RID}, INVALID_ENVELOPE),
        single({"kind": "follower.teleport", "requestId": RID}, frozenset({"unknown-kind"})),
        single({"kind": "follower.heartbeat", "requestId": RID}, INVALID_ENVELOPE),
        single({"kind": "follower.heartbeat", "requestId": RID, "instanceId": 42}, INVALID_ENVELOPE),
        single({"kind": "follower.send", **fenced, "message": {"type": "text", "text": "x" * 900_000}},
               INVALID_ENVELOPE),
        single({"kind": "follower.send", **fenced, "message": {"type": "Z" * 900_000}}, INVALID_ENVELOPE),
        single({"kind": "follower.send", **fenced, "message": {"type": "document", "fileName": "a",
                                                               "dataBase64": "abc"}}, INVALID_ENVELOPE),
        single(register_frame("/tmp/x", requestId=RID, pid=10**30), INVALID_ENVELOPE),
        single({"kind": "follower.heartbeat", **fenced, "registrationGeneration": "stale"},
               frozenset({"stale-generation"})),
        single({"kind": "follower.disconnect", **{k: v for k, v in fenced.items() if k != "registrationGeneration"}},
               frozenset({"stale-generation"})),
        single({"kind": "follower.disconnect", **fenced, "instanceId": "nobody"}, frozenset({"unknown-instance"})),
        single(register_frame("/tmp/x", requestId=RID, registrationGeneration=None),
               frozenset({"missing-generation"})),
        single({"kind": "follower.send", **fenced, "message": text, "chatId": b_target["chatId"],
                "threadId": b_target["threadId"]}, frozenset({"foreign-target"})),
        single({"kind": "follower.send", **fenced, "message": text, "threadId": b_target["threadId"]},
               frozenset({"foreign-target"})),
        Step(tuple(Bad(json.dumps({"kind": "follower.heartbeat", "requestId": used, "instanceId": "other"}),
                       frozenset({"request-id-collision"}), used) for used in used_ids)),
    ]


# --------------------------------------------------------------------------------------------------
# Driving one socket
# --------------------------------------------------------------------------------------------------


class Barrage:
    def __init__(self, bus: RawBus):
        self.bus = bus
        self.counter = 0
        self.frames = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"bad-{self.counter}"

    async def run(self, frames: list[Step]) -> None:
        for step in frames:
            rid = self.fresh()
            first: dict[str, Any] | None = None
            for frame in step.frames:
                text = frame.text.replace(RID_JSON, json.dumps(rid))
                assert len(text.encode()) < FRAME_LIMIT, "the strategy produced an oversized frame"
                reply = await self.bus.request(text, timeout=15)
                self.frames += 1
                if frame.codes is SAME_AS_FIRST:
                    assert reply == first, (reply, first)
                    continue
                assert reply.get("kind") == "bus.ack", reply
                assert reply.get("ok") is False, reply
                assert reply.get("requestId") == (rid if frame.rid is None else frame.rid), reply
                error = reply.get("error")
                assert isinstance(error, dict) and error.get("code") in frame.codes, (frame, reply)
                message = error.get("message")
                # A clear message, never an echo of a big input.
                assert isinstance(message, str) and 0 < len(message) <= 1024, reply
                first = first or reply
        # Exactly one ack per frame: the next frame on the socket answers this probe.
        probe = self.fresh()
        reply = await self.bus.request({"kind": "follower.heartbeat", "requestId": probe, "instanceId": "probe",
                                        "registrationGeneration": "g"})
        assert reply.get("requestId") == probe and reply["error"]["code"] == "unknown-instance", reply
        assert not self.bus.ws.closed


def stable_view(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What bad input must not change (clock-driven fields and display titles left out)."""
    followers = sorted(({k: f.get(k) for k in ("instanceId", "slot", "threadId", "bindingKey", "pid", "online")}
                        for f in snapshot["followers"]), key=lambda f: f["instanceId"])
    bindings = sorted(({k: b.get(k) for k in ("bindingKey", "slot", "threadId", "kind", "cwd", "session", "state",
                                              "topicState", "inactiveSinceMs", "queued", "instanceId")}
                       for b in snapshot["bindings"]), key=lambda b: b["bindingKey"])
    return {"followers": followers, "bindings": bindings, "pendingCleanups": snapshot.get("pendingCleanups"),
            "outboxPending": snapshot.get("outboxPending")}


def effect_counts(cluster: Cluster) -> dict[str, int]:
    return {m: len(cluster.fake.calls_to(m)) for m in TELEGRAM_EFFECTS}


async def test_hypothesis_barrage_of_bad_frames_on_one_socket(cluster: Cluster):
    """~150 hypothesis examples of bad frames on ONE open socket; each frame gets exactly one error ack.

    How hypothesis meets asyncio here: the leader, the fake Bot API and the sockets live on this
    test's event loop, which must keep running for the fake to answer the leader. So the
    ``@given`` function is an ordinary *sync* function run in a worker thread
    (``asyncio.to_thread``); each example hands its frames to the loop with
    ``asyncio.run_coroutine_threadsafe`` and blocks on the result. Hypothesis keeps full control
    (generation, shrinking, the falsifying example in the report) and the loop keeps serving.
    """
    await cluster.start_leader(TOPICBUS_FOLLOWER_STALE_AFTER_MS="600000")  # nobody is pruned meanwhile
    await cluster.wait_polling()
    bus, other = await RawBus.connect(cluster), await RawBus.connect(cluster)
    try:
        a, a_target = await bus.register(str(cluster.tmp / "agent-a"))
        b, b_target = await other.register(str(cluster.tmp / "agent-b"))
        assert a_target["threadId"] != b_target["threadId"]
        heartbeat = {"kind": "follower.heartbeat", "requestId": "hb-before-barrage", "instanceId": a["instanceId"],
                     "registrationGeneration": a["registrationGeneration"]}
        assert (await bus.request(heartbeat))["ok"] is True
        used_ids = [a["requestId"], heartbeat["requestId"]]
        before_status = stable_view(await cluster.status())
        before_calls = effect_counts(cluster)
        barrage = Barrage(bus)
        loop = asyncio.get_running_loop()

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(frames=st.lists(steps(a, a_target, b_target, used_ids), min_size=1, max_size=4))
        @example(frames=checklist(a, b_target, used_ids))
        def one_example(frames: list[Step]) -> None:
            asyncio.run_coroutine_threadsafe(barrage.run(frames), loop).result(timeout=120)

        await asyncio.to_thread(one_example)
        assert barrage.frames >= 150

        # The leader is healthy and nothing changed: routing, bindings, Telegram.
        code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
        assert code == 200 and health["role"] == "leader", health
        assert stable_view(await cluster.status()) == before_status
        assert effect_counts(cluster) == before_calls
        assert cluster.texts_in(a_target["threadId"]) == [] and cluster.texts_in(b_target["threadId"]) == []
        # An exact replay of the (successful) registration is answered as the first time and changes nothing.
        replayed = await bus.request(json.dumps(a))
        assert replayed["ok"] is True and replayed["result"] == a_target, replayed
        assert stable_view(await cluster.status()) == before_status
        assert effect_counts(cluster) == before_calls

        # The same socket still serves well-formed requests: a registration and a send.
        c, c_target = await bus.register(str(cluster.tmp / "agent-c"))
        reply = await bus.send_text(c, "after the barrage", "good-send-c")
        assert reply["ok"] is True, reply
        reply = await bus.send_text(a, "A is still routed", "good-send-a")
        assert reply["ok"] is True, reply
        await cluster.wait_text(c_target["threadId"], "after the barrage")
        await cluster.wait_text(a_target["threadId"], "A is still routed")
        assert cluster.lines_in(a_target["threadId"]) == ["A is still routed"]
        assert cluster.texts_in(b_target["threadId"]) == []
        hb = await other.request({"kind": "follower.heartbeat", "requestId": "b-alive", "instanceId": b["instanceId"],
                                  "registrationGeneration": b["registrationGeneration"]})
        assert hb["ok"] is True, hb
    finally:
        await bus.close()
        await other.close()


async def test_oversized_and_binary_frames_close_only_their_socket(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_FOLLOWER_STALE_AFTER_MS="600000")
    await cluster.wait_polling()
    keeper, big, binary = (await RawBus.connect(cluster), await RawBus.connect(cluster),
                           await RawBus.connect(cluster))
    try:
        reg, target = await keeper.register(str(cluster.tmp / "keeper"))

        # Just under the limit: an error ack, the socket stays open.
        near = json.dumps({"kind": "follower.heartbeat", "requestId": "near-limit", "instanceId": "x" * 1_000_000})
        assert len(near.encode()) < FRAME_LIMIT
        reply = await big.request(near)
        assert reply["requestId"] == "near-limit" and reply["error"]["code"] == "invalid-envelope"

        await big.send("x" * (FRAME_LIMIT + 1))
        msg = await asyncio.wait_for(big.ws.receive(), 10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING), msg
        assert big.ws.close_code == 1009

        await binary.ws.send_bytes(b'{"kind":"follower.heartbeat"}')
        msg = await asyncio.wait_for(binary.ws.receive(), 10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING), msg
        assert binary.ws.close_code == 1003

        # The other socket (and its follower) is untouched.
        assert not keeper.ws.closed
        hb = await keeper.request({"kind": "follower.heartbeat", "requestId": "still-here",
                                   "instanceId": reg["instanceId"],
                                   "registrationGeneration": reg["registrationGeneration"]})
        assert hb["ok"] is True, hb
        assert (await keeper.send_text(reg, "survivor", "send-1"))["ok"] is True
        await cluster.wait_text(target["threadId"], "survivor")
        code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
        assert code == 200 and health["role"] == "leader" and health["followers"] == 1
    finally:
        for bus in (keeper, big, binary):
            await bus.close()


async def test_missing_or_wrong_authorization_is_401_before_upgrade(cluster: Cluster):
    await cluster.start_leader()
    await cluster.wait_polling()
    url = f"ws://127.0.0.1:{cluster.port}/v1/bus"
    async with aiohttp.ClientSession() as session:
        for header in (None, "Bearer wrong-secret", f"Basic {SECRET}", "Bearer ", SECRET, f"Bearer {SECRET}x",
                       f"Bearer {SECRET[:-1]}"):
            headers = {} if header is None else {"Authorization": header}
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await session.ws_connect(url, headers=headers)
            assert caught.value.status == 401, header
            # The same request as a bare upgrade attempt: answered 401, never 101 Switching Protocols.
            upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                       "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), **headers}
            async with session.get(url.replace("ws://", "http://"), headers=upgrade) as resp:
                assert resp.status == 401, header
                assert "upgrade" not in resp.headers.get("Connection", "").lower()
        # The right secret still gets in, and the leader never registered anything for the others.
        bus = await RawBus.connect(cluster)
        await bus.close()
    code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
    assert code == 200 and health["followers"] == 0


# --------------------------------------------------------------------------------------------------
# Telegram side
# --------------------------------------------------------------------------------------------------


async def start_recorded_follower(cluster: Cluster, name: str) -> tuple[Path, int]:
    work = cluster.tmp / name
    out = cluster.tmp / f"{name}.stdin.txt"
    await cluster.start_follower(work, script=RECORDING_AGENT, AGENT_OUT=str(out))
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    return out, thread


def _chat() -> dict[str, Any]:
    return {"id": CHAT_ID, "type": "supergroup", "title": "Forum", "is_forum": True}


async def test_unroutable_telegram_updates_are_ignored_and_routing_continues(cluster: Cluster):
    """Well-formed updates that must not reach any follower; a valid one after them still does.
    (An owner's edit in an agent's topic is routed: tests/e2e/test_inbound.py.)"""
    await cluster.start_leader()
    await cluster.wait_polling()
    out, thread = await start_recorded_follower(cluster, "tg-target")
    fake = cluster.fake
    now = int(time.time())
    owner = {"id": OWNER_ID, "is_bot": False, "first_name": "Owner"}
    in_topic = {"date": now, "chat": _chat(), "message_thread_id": thread, "is_topic_message": True}
    sends_before = len(fake.calls_to("sendMessage"))

    fake.push_update({"message": {**in_topic, "message_id": 9001, "text": "BAD no from"}})
    fake.push_update({"message": {**in_topic, "message_id": 9002, "text": "BAD anonymous admin",
                                  "from": {"id": 1087968824, "is_bot": True, "first_name": "Group"},
                                  "sender_chat": _chat()}})
    fake.push_message(CHAT_ID, "BAD unknown thread", thread_id=987654, from_id=OWNER_ID)
    fake.push_update({"message": {**in_topic, "message_id": 9004, "text": "BAD from the bot itself",
                                  "from": fake._bot_from()}})
    fake.push_message(CHAT_ID, "BAD from a stranger", thread_id=thread, from_id=OWNER_ID + 1)
    fake.push_topic_event(CHAT_ID, None, "created", "made by a user")
    unowned = max(t.thread_id for t in fake.topics(CHAT_ID))
    fake.push_message(CHAT_ID, "BAD topic nobody owns", thread_id=unowned, from_id=OWNER_ID)
    fake.push_update({"message": {"message_id": 9005, "date": now, "from": owner, "text": "BAD non-forum group",
                                  "chat": {"id": -100555, "type": "group", "title": "plain group"}}})
    fake.push_update({"message": {"message_id": 9006, "date": now, "from": owner, "text": "BAD private chat",
                                  "chat": {"id": OWNER_ID, "type": "private", "first_name": "Owner"}}})
    fake.push_update({"message": {**in_topic, "message_id": 9007, "from": owner,
                                  "sticker": {"file_id": "st1", "file_unique_id": "ust1", "type": "regular",
                                              "width": 512, "height": 512, "is_animated": False,
                                              "is_video": False}}})
    fake.push_message(CHAT_ID, "BAD general topic", thread_id=None, from_id=OWNER_ID)
    fake.push_message(CHAT_ID, "valid owner message", thread_id=thread, from_id=OWNER_ID)

    await cluster.wait_for(lambda: "valid owner message" in recorded_lines(out), message="valid message delivered")
    assert recorded_lines(out) == ["valid owner message"]
    await cluster.wait_for(lambda: not fake.pending_updates(), message="all updates confirmed")
    # No notice, no reply to anything bad; only the owner's messages outside agent topics get the
    # hint where they were written (General, the topic nobody owns, the unknown thread).
    def hinted() -> set[int | None]:
        return {c.params.get("message_thread_id") for c in fake.calls_to("sendMessage")[sends_before:]}

    await cluster.wait_for(lambda: hinted() == {None, unowned, 987654}, message="hints outside agent topics")
    assert all(c.params["text"] in (GENERAL_HINT, TOPIC_HINT) for c in fake.calls_to("sendMessage")[sends_before:])
    assert all(not (m.text or "").startswith("BAD") for m in fake.sent)
    code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
    assert code == 200 and health["role"] == "leader" and health["epoch"] == 1
    assert cluster.procs[0].process.returncode is None


async def test_structurally_malformed_telegram_updates_do_not_wedge_polling(cluster: Cluster):
    """Updates the Bot API should never send (missing required fields, wrong types) are skipped:
    the leader keeps its term (same epoch), routes the next valid message, delivers nothing bad."""
    await cluster.start_leader()
    await cluster.wait_polling()
    out, thread = await start_recorded_follower(cluster, "tg-malformed")
    fake = cluster.fake
    now = int(time.time())
    owner = {"id": OWNER_ID, "is_bot": False, "first_name": "Owner"}
    in_topic = {"date": now, "chat": _chat(), "message_thread_id": thread, "is_topic_message": True}

    fake.push_update({"message": {"message_id": 9101, "text": "BAD no chat, no date", "from": owner}})
    fake.push_update({"message": {**in_topic, "text": "BAD no message_id", "from": owner}})
    fake.push_update({"message": {**in_topic, "message_id": 9102, "text": "BAD chat without type", "from": owner,
                                  "chat": {"id": CHAT_ID}}})
    fake.push_update({"message": "BAD not an object"})
    fake.push_message(CHAT_ID, "valid after malformed", thread_id=thread, from_id=OWNER_ID)

    await cluster.wait_for(lambda: "valid after malformed" in recorded_lines(out), timeout=10,
                           message="the valid message after malformed updates")
    assert recorded_lines(out) == ["valid after malformed"]
    code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
    assert code == 200 and health["role"] == "leader" and health["epoch"] == 1, health


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------

FAKE_TOKEN = "987654321:AAHfakeTokenValue-ForConfigTests"


def run_leader_with(tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOPICBUS_")}
    base.update({"TOPICBUS_BOT_TOKEN": FAKE_TOKEN, "TOPICBUS_CHAT_ID": str(CHAT_ID),
                 "TOPICBUS_OWNER_IDS": str(OWNER_ID), "TOPICBUS_BUS_SECRET": SECRET,
                 "TOPICBUS_API_BASE_URL": "http://127.0.0.1:9/bot", "TOPICBUS_BUS_PORT": "0",
                 "TOPICBUS_DB_PATH": str(tmp / "never.sqlite3")})
    for key, value in env.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return subprocess.run([sys.executable, "-m", "topicbus", "leader"], capture_output=True, text=True, env=base,
                          cwd=str(tmp), timeout=15)


def assert_config_refused(result: subprocess.CompletedProcess[str], variables: list[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    assert FAKE_TOKEN not in output and FAKE_TOKEN.split(":")[1] not in output, output
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for variable in variables:
        naming = [line for line in lines if variable in line]
        assert len(naming) == 1, (variable, output)  # one readable line per problem
    assert len(lines) <= len(variables) + 1, output  # a heading plus those lines, nothing else


@pytest.mark.parametrize("env, variable", [
    ({"TOPICBUS_BUS_PORT": "abc"}, "TOPICBUS_BUS_PORT"),
    ({"TOPICBUS_BUS_PORT": "70000"}, "TOPICBUS_BUS_PORT"),
    ({"TOPICBUS_OWNER_IDS": "x,y"}, "TOPICBUS_OWNER_IDS"),
    ({"TOPICBUS_API_BASE_URL": "ftp://x"}, "TOPICBUS_API_BASE_URL"),
    ({"TOPICBUS_BOT_TOKEN": None}, "TOPICBUS_BOT_TOKEN"),
    ({"TOPICBUS_CHAT_ID": "general"}, "TOPICBUS_CHAT_ID"),
], ids=["port-not-int", "port-range", "owner-ids", "api-url-scheme", "token-missing", "chat-id"])
def test_invalid_configuration_exits_2_naming_the_variable(tmp_path: Path, env: dict[str, str], variable: str):
    assert_config_refused(run_leader_with(tmp_path, env), [variable])


def test_every_configuration_problem_is_reported_at_once(tmp_path: Path):
    """An operator fixing the environment sees every problem in one go, not one per restart."""
    result = run_leader_with(tmp_path, {"TOPICBUS_BUS_PORT": "abc", "TOPICBUS_OWNER_IDS": "x,y",
                                        "TOPICBUS_API_BASE_URL": "ftp://x", "TOPICBUS_BOT_TOKEN": None})
    assert_config_refused(result, ["TOPICBUS_BUS_PORT", "TOPICBUS_OWNER_IDS", "TOPICBUS_API_BASE_URL",
                                   "TOPICBUS_BOT_TOKEN"])


def test_config_errors_never_echo_the_token(tmp_path: Path):
    """The token is refused only by Telegram later; a bad neighbour must not leak it in the error."""
    result = run_leader_with(tmp_path, {"TOPICBUS_PRUNE_INTERVAL_MS": "-1", "TOPICBUS_LOG_LEVEL": "LOUD"})
    assert_config_refused(result, ["TOPICBUS_PRUNE_INTERVAL_MS", "TOPICBUS_LOG_LEVEL"])
