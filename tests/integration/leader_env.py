"""A leader runtime assembled exactly as in production, over a real SQLite file and the real PTB
``Bot`` talking HTTP to the fake Bot API — without the process, the poller or the bus socket, so
reference cases can drive registration, pruning and departure step by step with a manual clock."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telegram import Bot
from telegram.ext import Application, ApplicationBuilder

from topicbus.leader.assembly import assemble_pruner, assemble_runtime
from topicbus.host import FakeLiveness, Liveness
from topicbus.logsetup import EventJournal
from topicbus.protocol import ProtocolError, Registration, decode_frame, encode, follower_identity
from topicbus.core.pruning import FollowerPruner
from topicbus.leader.runtime import LeaderRuntime
from topicbus.settings import DisplayMode
from topicbus.storage.db import Authority, Database
from topicbus.storage.lease import LeaseRepository
from tests.fakebotapi import FakeBotApi

os.environ.setdefault("PTB_TIMEDELTA", "true")

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
    """The FollowerConnection port in memory: records frames the leader sends to one follower."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False

    async def send_frame(self, frame: dict[str, Any]) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.frames.append(frame)

    async def close(self, code: int = 1000, message: str = "") -> None:
        self.closed = True

    def deliveries(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("kind") == "leader.deliver"]


def registration(instance_id: str, *, cwd: str | None = "/repo/a", generation: str | None = "g1",
                 pid: int | None = 4242, session: str | None = None, name: str | None = None,
                 protocol: dict[str, Any] | None | str = "default", host: str = HOST) -> Registration:
    frame: dict[str, Any] = {"kind": "follower.register", "requestId": f"{instance_id}:{uuid.uuid4().hex[:6]}",
                             "instanceId": instance_id, "pid": pid, "processBirthId": f"{pid}:start:77",
                             "hostId": host}
    if generation is not None:
        frame["registrationGeneration"] = generation
    if cwd is not None:
        frame["cwd"] = cwd
    if session is not None:
        frame["sessionId"] = session
    if name is not None:
        frame["name"] = name
    if protocol == "default":
        frame["protocol"] = follower_identity("test")
    elif protocol is not None:
        frame["protocol"] = protocol
    _, model, _ = decode_frame(encode(frame))
    return model


def fenced(kind: str, instance_id: str, generation: str | None, **extra: Any):
    frame = {"kind": kind, "requestId": f"{instance_id}:{uuid.uuid4().hex[:6]}", "instanceId": instance_id, **extra}
    if generation is not None:
        frame["registrationGeneration"] = generation
    return decode_frame(encode(frame))[1]


class LeaderEnv:
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
        self.runtime: LeaderRuntime | None = None
        self.pruner: FollowerPruner | None = None
        self.authority: Authority | None = None
        self.connections: dict[str, MemoryConnection] = {}

    async def start(self, *, provision_control: bool = True, replay: bool = True) -> LeaderRuntime:
        self.db = self.db or await Database.open(self.tmp / "topicbus.sqlite3")
        self.app = (ApplicationBuilder().token(TOKEN).base_url(self.fake.base_url)
                    .base_file_url(self.fake.base_file_url).updater(None).read_timeout(self.read_timeout).build())
        await self.app.initialize()
        await self.app.start()
        self.bot = self.app.bot
        self.authority = await LeaseRepository(self.db).try_acquire(self.owner, self.clock.now_ms(), 8_000)
        assert self.authority is not None
        self.runtime = assemble_runtime(db=self.db, bot=self.bot, clock=self.clock, events=self.events,
                                        owner=self.owner, chat_id=CHAT, liveness=self.liveness,  # type: ignore[arg-type]
                                        default_cleanup=self.cleanup, default_display_mode=self.display_mode,
                                        job_queue=self.app.job_queue)
        self.runtime.authority = self.authority
        await self.runtime.load_runtime_settings()
        if replay:
            await self.runtime.departure.replay(self.authority)
        if provision_control:
            await self.runtime.provision_control_topic()
        await self.runtime.restore_roster()
        self.pruner = assemble_pruner(self.runtime, clock=self.clock, stale_after_ms=self.stale_after_ms,
                                      events=self.events)
        self.pruner.begin()
        return self.runtime

    async def restart(self, **kwargs: Any) -> LeaderRuntime:
        """A successor leader on the same database (new owner, new epoch)."""
        await self.stop(close_db=False)
        self.owner = f"leader-{uuid.uuid4().hex[:6]}"
        self.clock.advance(10_000)
        return await self.start(**kwargs)

    async def stop(self, *, close_db: bool = True) -> None:
        if self.pruner is not None:
            self.pruner.stop()
        if self.runtime is not None:
            await self.runtime.outbox.stop()
            await self.runtime.close()
        if self.app is not None:
            if self.runtime is not None and self.runtime.display is not None:
                self.runtime.display.cancel_startup()
            await self.app.stop()
            await self.app.shutdown()
            self.app = None
        if close_db and self.db is not None:
            await self.db.close()
            self.db = None

    async def register(self, instance_id: str, **kwargs: Any) -> dict[str, Any]:
        assert self.runtime is not None
        conn = self.connections.setdefault(instance_id, MemoryConnection())
        return await self.runtime.register(registration(instance_id, **kwargs), conn)

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

    async def binding(self, cwd: str) -> Any:
        assert self.runtime is not None
        return next((b for b in await self.runtime.bindings.all() if b.cwd == cwd), None)

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
