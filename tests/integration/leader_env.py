"""A leader runtime assembled exactly as in production, over a real SQLite file and the real PTB
``Bot`` talking HTTP to the fake Bot API — without the process, the poller or the bus socket, so
reference cases can drive registration, pruning and departure step by step with a manual clock."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telegram import Bot
from telegram.ext import Application, ApplicationBuilder

from topicbus.bot.timers import JobQueueTimers
from topicbus.core.budget import BudgetConfig
from topicbus.leader.outbound import OutboundOptions
from topicbus.leader.assembly import LeaderServices, assemble, close_term, open_term
from topicbus.leader.transcription import TranscriptionOptions
from topicbus.leader.term import LeaderTerm
from topicbus.core.bindings import Binding
from topicbus.storage.bindings import BindingRepository
from topicbus.core.liveness import Liveness
from topicbus.logsetup import EventJournal
from topicbus.core.records import Deliver, Superseded
from topicbus.protocol import (ProtocolError, Registration, decode_frame, disconnect_frame, encode, follower_identity,
                               heartbeat_frame, leader_frame, register_frame, wire_result)
from topicbus.leader.pruner import FollowerPruner
from topicbus.core.display import DisplayMode
from topicbus.core.authority import Authority
from topicbus.storage.db import Database
from topicbus.storage.lease import LeaseRepository
from tests.doubles import FakeLiveness
from tests.fakebotapi import FakeBotApi

TOKEN = "123456:TEST-integration-token-0000000000000"
CHAT = -1001234567890
HOST = "host-under-test"


class ManualClock:
    def __init__(self, now_ms: int = 1_000):
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass
class MemoryConnection:
    """The FollowerConnection port in memory: records frames the leader sends to one follower, as they
    go on the wire (the bus transport's converter)."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False
    congested: bool = False  # an in-memory queue always has room

    async def writable(self) -> None:
        if self.closed:
            raise ConnectionError("closed")

    async def send_frame(self, frame: Deliver | Superseded) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.frames.append(leader_frame(frame))

    async def close(self, code: int = 1000, message: str = "") -> None:
        self.closed = True

    def deliveries(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("kind") == "leader.deliver"]


def registration(instance_id: str, *, cwd: str | None = "/repo/a", generation: str | None = "g1",
                 pid: int | None = 4242, session: str | None = None, name: str | None = None,
                 protocol: dict[str, Any] | None | str = "default", host: str = HOST) -> Registration:
    frame = register_frame(f"{instance_id}:{uuid.uuid4().hex[:6]}", instance_id, generation,  # type: ignore[arg-type]
                           protocol=follower_identity("test") if protocol == "default" else (protocol or {}),
                           pid=pid, process_birth_id=f"{pid}:start:77", host_id=host, cwd=cwd, session_id=session,
                           name=name)
    if protocol is None:
        del frame["protocol"]
    model = decode_frame(encode(frame))
    assert isinstance(model, Registration)
    return model


def fenced(kind: str, instance_id: str, generation: str | None, **extra: Any):
    build = {"follower.heartbeat": heartbeat_frame, "follower.disconnect": disconnect_frame}[kind]
    frame = {**build(f"{instance_id}:{uuid.uuid4().hex[:6]}", instance_id, generation), **extra}
    return decode_frame(encode(frame))


class LeaderEnv:
    """One leader term assembled and opened exactly as in production (``assemble`` + ``open_term``),
    with a manual clock and fake liveness, and without the poller and the bus socket."""

    def __init__(self, fake: FakeBotApi, tmp: Path, *, cleanup: bool = True, stale_after_ms: int = 15_000):
        self.fake = fake
        self.tmp = tmp
        self.cleanup = cleanup
        self.stale_after_ms = stale_after_ms
        self.clock = ManualClock()
        self.liveness = FakeLiveness()
        self.events = EventJournal()
        self.owner = f"leader-{uuid.uuid4().hex[:6]}"
        self.db: Database | None = None
        self.bot: Bot | None = None
        self.app: Application | None = None
        self.display_mode = DisplayMode.LETTERS
        self.read_timeout = 5.0
        self.display_debounce_s = 1.0
        # A budget the tests never wait for, unless a test asks for Telegram's real one.
        self.outbound_options = OutboundOptions(budget=BudgetConfig(per_minute=100_000, per_second=1_000,
                                                                    overall_per_second=10_000))
        self.offline_ttl_s = 86_400.0
        self.receipt_reaction: str | None = "👀"
        self.cleanup_grace_s = 0.0  # the reference's cases delete at once; grace tests set their own
        self.transcription = TranscriptionOptions()  # voice notes stay files unless a test sets an endpoint
        self.services: LeaderServices | None = None
        self.term: LeaderTerm | None = None
        self.authority: Authority | None = None
        self.connections: dict[str, MemoryConnection] = {}

    async def start(self, *, provision_control: bool = True, replay: bool = True) -> LeaderServices:
        self.db = self.db or await Database.open(self.tmp / "topicbus.sqlite3")
        self.app = (ApplicationBuilder().token(TOKEN).base_url(self.fake.base_url)
                    .base_file_url(self.fake.base_file_url).updater(None).read_timeout(self.read_timeout).build())
        await self.app.initialize()
        await self.app.start()
        self.bot = self.app.bot
        self.authority = await LeaseRepository(self.db).try_acquire(self.owner, self.clock.now_ms(), 8_000)
        assert self.authority is not None
        self.term = LeaderTerm(self.owner)
        self.term.begin(self.authority)
        assert self.app.job_queue is not None
        self.services = assemble(self.term, db=self.db, bot=self.bot, clock=self.clock, events=self.events,
                                 chat_id=CHAT, timers=JobQueueTimers(self.app.job_queue),
                                 liveness=self.liveness, default_cleanup=self.cleanup,  # type: ignore[arg-type]
                                 default_display_mode=self.display_mode, stale_after_ms=self.stale_after_ms,
                                 display_debounce_s=self.display_debounce_s,
                                 outbound_options=self.outbound_options, offline_ttl_s=self.offline_ttl_s,
                                 receipt_reaction=self.receipt_reaction, cleanup_grace_s=self.cleanup_grace_s,
                                 transcription=self.transcription)

        async def no_control_topic() -> bool:
            return True

        await open_term(self.services, replay=replay,
                        provision_control=None if provision_control else no_control_topic)
        # No poller here, so the startup window is never armed: tests that need it open it themselves
        # (begin + arm); the others run with scheduling unsuppressed, as after the window.
        self.services.display.startup.cancel()
        return self.services

    async def restart(self, **kwargs: Any) -> LeaderServices:
        """A successor leader on the same database (new owner, new epoch)."""
        await self.stop(close_db=False)
        self.owner = f"leader-{uuid.uuid4().hex[:6]}"
        self.clock.advance(10_000)
        return await self.start(**kwargs)

    async def stop(self, *, close_db: bool = True) -> None:
        if self.services is not None:
            await close_term(self.services)
            self.services = None
        if self.app is not None:
            await self.app.stop()
            await self.app.shutdown()
            self.app = None
        if close_db and self.db is not None:
            await self.db.close()
            self.db = None

    async def register(self, instance_id: str, **kwargs: Any) -> dict[str, Any]:
        """Register a follower; the ack's ``result`` as the follower reads it."""
        assert self.services is not None
        conn = self.connections.setdefault(instance_id, MemoryConnection())
        return wire_result(await self.services.followers.register(registration(instance_id, **kwargs), conn))

    async def register_error(self, instance_id: str, **kwargs: Any) -> ProtocolError:
        try:
            await self.register(instance_id, **kwargs)
        except ProtocolError as exc:
            return exc
        raise AssertionError("registration unexpectedly succeeded")

    def set_dead(self, pid: int) -> None:
        self.liveness.set(pid, Liveness.DEAD)

    def set_alive(self, pid: int) -> None:
        self.liveness.set(pid, Liveness.ALIVE)

    async def bindings(self) -> list[Binding]:
        assert self.db is not None
        return await BindingRepository(self.db).all()

    async def binding(self, cwd: str) -> Any:
        return next((b for b in await self.bindings() if b.cwd == cwd), None)

    @property
    def pruner(self) -> FollowerPruner:
        assert self.services is not None
        return self.services.pruner

    def calls(self, method: str) -> list[Any]:
        return self.fake.calls_to(method)

    def phases(self) -> list[str]:
        return [e.phase for e in self.events.recent()]


class Hold:
    """Wraps one fake Bot API method so a test can act while that call is in flight."""

    def __init__(self, fake: FakeBotApi, method: str, *, before=None):
        import asyncio

        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0
        name, original = fake._methods[method.lower()]
        self._before = before

        async def held(params: dict[str, Any]) -> Any:
            self.calls += 1
            if self._before is not None:
                result = self._before(params)
                if hasattr(result, "__await__"):
                    await result
            self.entered.set()
            await self.release.wait()
            return original(params)

        fake.register_method(name, held)
