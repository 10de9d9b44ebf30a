"""Shared plumbing for ``python -m bench``: fake Telegram, a real leader subprocess, followers, figures.

Everything runs on loopback on this machine:

* the fake Bot API (:class:`BenchFakeBotApi`, a thin subclass of ``tests.fakebotapi.FakeBotApi``)
  runs **in the bench process**, in the bench's event loop;
* the leader is a **real subprocess** (``sys.executable -m topicbus leader``) configured through
  ``TOPICBUS_*`` variables the way ``tests/e2e/harness.py`` does it (fast poll timeout, rate limits
  raised out of the way, a temporary database);
* followers are in-process :class:`topicbus.follower.client.FollowerClient` objects.

Because the fake server and the followers share the bench process, both ends of an inbound
latency (the moment ``getUpdates`` handed an update out, the moment a follower received it) are
read from the same ``time.monotonic()`` clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from loguru import logger

from topicbus import Delivery, FollowerClient
from topicbus.protocol import Kind, follower_identity
from tests.fakebotapi import FakeBotApi

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "123456789:BENCH-token-not-a-real-one-0000000"
SECRET = "bench-bus-secret-0123456789"
OWNER_ID = 424242
CHAT_ID = -1001234567890


def quiet_logs() -> None:
    """The follower client logs through loguru; keep the bench output to warnings and worse."""
    logger.remove()
    logger.add(sys.stderr, level="ERROR", format="{time:HH:mm:ss} {level} {message}")


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass
class Metric:
    """One line of the final table.

    ``better`` is ``"higher"`` or ``"lower"``; ``ratio`` is always oriented so that > 1 is better
    (value/target for higher-is-better, target/value for lower-is-better).
    """

    name: str
    value: float | None
    unit: str
    target: float | None = None
    better: str = "higher"
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.target is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return None
        if self.better == "higher":
            return self.value / self.target if self.target else None
        return self.target / self.value if self.value else math.inf

    @property
    def verdict(self) -> str:
        ratio = self.ratio
        if ratio is None:
            return "info"
        return "pass" if ratio >= 1.0 else "MISS"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "unit": self.unit, "target": self.target,
                "better": self.better, "ratio": self.ratio, "verdict": self.verdict, "note": self.note}


@dataclass
class Report:
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, value: float | None, unit: str, target: float | None = None, better: str = "higher",
            note: str = "") -> Metric:
        metric = Metric(name, value, unit, target, better, note)
        self.metrics.append(metric)
        return metric


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) < 1 and value != 0:
        return f"{value:.{max(digits, 3)}f}"
    return f"{value:.{digits}f}"


def loadavg() -> str:
    """The 1/5/15-minute load averages (other work on the machine skews every figure)."""
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "n/a"


def say(text: str = "") -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------------------------
# The fake Bot API, instrumented
# --------------------------------------------------------------------------------------------


class BenchFakeBotApi(FakeBotApi):
    """``FakeBotApi`` that stamps the moment each update is handed out by ``getUpdates``.

    ``handed_out[update_id]`` is ``time.monotonic()`` taken right after the ``getUpdates`` response
    was built (JSON already serialised), i.e. as late as the server can observe before aiohttp
    writes the bytes. The first hand-out wins (a re-fetch after a failure keeps the first stamp).

    The flood limiter's window is configurable (``set_flood_limit(..., window_s=…)``); the bench
    shortens it to compress time where it says so.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed_out: dict[int, float] = {}
        self.send_ok_times: list[float] = []  # monotonic time of every successful sendMessage

    async def _get_updates(self, p: dict[str, Any], request: web.Request) -> list[dict[str, Any]]:
        batch = await super()._get_updates(p, request)
        request["bench_batch"] = [u["update_id"] for u in batch]
        return batch

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        response = await super()._handle(request)
        now = time.monotonic()
        for update_id in request.get("bench_batch", ()):
            self.handed_out.setdefault(update_id, now)
        if response.status == 200 and request.match_info.get("method", "").lower() == "sendmessage":
            self.send_ok_times.append(now)
        return response


# --------------------------------------------------------------------------------------------
# The leader subprocess
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leader_env(fake: FakeBotApi, db_path: Path, port: int, **extra: str) -> dict[str, str]:
    """The e2e harness recipe (tests/e2e/harness.py ``Cluster.env``), tuned for measuring:
    production-like liveness timings (so a busy loop never prunes a follower mid-run), rate
    limits raised out of the way (we measure the leader, not the limiter), INFO logging."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICBUS_")}
    env.update({
        "PYTHONPATH": str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "TOPICBUS_BOT_TOKEN": TOKEN,
        "TOPICBUS_CHAT_ID": str(CHAT_ID),
        "TOPICBUS_OWNER_IDS": str(OWNER_ID),
        "TOPICBUS_API_BASE_URL": fake.base_url,
        "TOPICBUS_DB_PATH": str(db_path),
        "TOPICBUS_BUS_HOST": "127.0.0.1",
        "TOPICBUS_BUS_PORT": str(port),
        "TOPICBUS_BUS_SECRET": SECRET,
        "TOPICBUS_LEADER_URL": f"ws://127.0.0.1:{port}/v1/bus",
        "TOPICBUS_POLL_TIMEOUT_S": "1",
        "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "15000",
        "TOPICBUS_PRUNE_INTERVAL_MS": "1000",
        "TOPICBUS_HEARTBEAT_INTERVAL_MS": "1000",
        "TOPICBUS_LEASE_REFRESH_MS": "2000",
        "TOPICBUS_LEASE_STALE_AFTER_MS": "8000",
        "TOPICBUS_RATE_LIMIT_PER_SECOND": "1000",
        "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "100000",
        "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1000",
        "TOPICBUS_LOG_LEVEL": "INFO",
    })
    env.update(extra)
    return env


_LIVE_PIDS: set[int] = set()


def kill_strays() -> None:
    """Last-resort cleanup (atexit / signal): SIGKILL every leader process group still alive."""
    for pid in list(_LIVE_PIDS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _LIVE_PIDS.discard(pid)


class LeaderProc:
    """One ``topicbus leader`` subprocess with its own database and bus port."""

    def __init__(self, fake: FakeBotApi, workdir: Path, *, label: str = "leader",
                 profile_dir: Path | None = None, profiler: str = "cprofile", env: dict[str, str] | None = None):
        self.fake = fake
        self.workdir = workdir
        self.label = label
        self.port = free_port()
        self.db_path = workdir / f"{label}.sqlite3"
        self.log_path = workdir / f"{label}.log"
        self.profiler = profiler
        suffix = ".prof" if profiler == "cprofile" else ".pyisession"
        self.profile_path = (profile_dir / f"{label}{suffix}") if profile_dir else None
        self.extra_env = env or {}
        self.process: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self._session: aiohttp.ClientSession | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/bus"

    async def start(self) -> None:
        args = [sys.executable]
        if self.profile_path is not None and self.profiler == "pyinstrument":
            # Wall-clock sampling of the main thread (pip install pyinstrument; not a project dependency).
            # Render later: `pyinstrument --load=FILE [-r html]`.
            args += ["-m", "pyinstrument", "-i", "0.0002", "-r", "pyisession", "-o", str(self.profile_path)]
        elif self.profile_path is not None:
            args += ["-m", "cProfile", "-o", str(self.profile_path)]
        args += ["-m", "topicbus", "leader"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        try:
            self.started_at = time.monotonic()
            self.process = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(self.workdir),
                env=leader_env(self.fake, self.db_path, self.port, **self.extra_env), start_new_session=True)
        finally:
            log.close()
        _LIVE_PIDS.add(self.process.pid)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))

    async def healthz(self) -> tuple[int, Any]:
        assert self._session is not None
        try:
            async with self._session.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
                return resp.status, await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return 0, None

    async def wait_healthy(self, timeout: float = 30.0, interval: float = 0.01) -> float:
        """Poll /healthz until 200 with role leader; return seconds since the process was spawned."""
        deadline = time.monotonic() + timeout
        while True:
            code, body = await self.healthz()
            if code == 200 and isinstance(body, dict) and body.get("role") == "leader":
                return time.monotonic() - self.started_at
            if self.process is not None and self.process.returncode is not None:
                raise RuntimeError(f"leader exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"leader not healthy after {timeout}s:\n{self.log_tail()}")
            await asyncio.sleep(interval)

    async def metrics(self) -> dict[str, float]:
        assert self._session is not None
        out: dict[str, float] = {}
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self._session.get(f"http://127.0.0.1:{self.port}/metrics") as resp:
                for line in (await resp.text()).splitlines():
                    if line and not line.startswith("#"):
                        name, _, value = line.partition(" ")
                        with contextlib.suppress(ValueError):
                            out[name] = float(value)
        return out

    def rss_kb(self) -> int | None:
        """VmRSS of the leader (kB), from /proc/<pid>/status."""
        if self.process is None or self.process.returncode is not None:
            return None
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def cpu_s(self) -> float | None:
        """User + system CPU seconds the leader (all its threads) has used so far (/proc/<pid>/stat)."""
        if self.process is None or self.process.returncode is not None:
            return None
        try:
            with open(f"/proc/{self.pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def log_problems(self) -> list[str]:
        """ERROR/Traceback lines in the leader log (the bench reports them; it never asserts)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ln for ln in lines if "ERROR" in ln or "Traceback" in ln or "CRITICAL" in ln]

    async def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (graceful: a profile is written), then SIGKILL the whole group if it lingers."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc = self.process
        if proc is None:
            return None
        try:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), timeout)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything the leader left in its group
            _LIVE_PIDS.discard(proc.pid)
        return proc.returncode


@contextlib.asynccontextmanager
async def running_leader(fake: FakeBotApi, workdir: Path, *, label: str, profile_dir: Path | None = None,
                         profiler: str = "cprofile", env: dict[str, str] | None = None):
    leader = LeaderProc(fake, workdir, label=label, profile_dir=profile_dir, profiler=profiler, env=env)
    try:
        await leader.start()
        await leader.wait_healthy()
        yield leader
    finally:
        await leader.stop()


# --------------------------------------------------------------------------------------------
# Followers
# --------------------------------------------------------------------------------------------


class BenchFollower:
    """A ``FollowerClient`` whose ``on_delivery`` records (monotonic receipt time) per message id."""

    def __init__(self, leader: LeaderProc, cwd: Path, *, expect: Callable[[], None] | None = None):
        cwd.mkdir(parents=True, exist_ok=True)
        self.cwd = cwd
        self.received: dict[int, float] = {}  # Telegram message_id -> monotonic receipt time
        self.texts: list[str] = []
        self.duplicates = 0
        self._on_any = expect
        # An explicit instance id: the client's default (f"{pid}:{ms}") collides when several clients
        # are created in one process within the same millisecond.
        self.client = FollowerClient(leader_url=leader.url, secret=SECRET, on_delivery=self._on_delivery,
                                     cwd=str(cwd), instance_id=f"bench-{os.getpid()}-{uuid.uuid4().hex[:12]}",
                                     heartbeat_interval_s=1.0, request_timeout_s=30.0)

    async def _on_delivery(self, delivery: Delivery) -> None:
        now = time.monotonic()
        mid = delivery.message_id
        if mid is None:
            return
        if mid in self.received:
            self.duplicates += 1
            return
        self.received[mid] = now
        self.texts.append(delivery.text or "")
        if self._on_any is not None:
            self._on_any()

    @property
    def thread_id(self) -> int:
        assignment = self.client.assignment
        assert assignment is not None
        return assignment.thread_id

    async def start(self, timeout: float = 30.0) -> None:
        await self.client.start()
        await self.client.wait_registered(timeout)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 15)


async def start_followers(leader: LeaderProc, base: Path, count: int, *, expect: Callable[[], None] | None = None,
                          prefix: str = "ws") -> list[BenchFollower]:
    followers = [BenchFollower(leader, base / f"{prefix}-{i:02d}", expect=expect) for i in range(count)]
    # Register one at a time: it is how agents arrive, and it keeps slot letters deterministic.
    try:
        for f in followers:
            await f.start()
    except BaseException:
        await close_followers(followers)
        raise
    return followers


async def close_followers(followers: list[BenchFollower]) -> None:
    await asyncio.gather(*(f.close() for f in followers), return_exceptions=True)


class Counter:
    """Counts events and wakes a waiter when a target is reached."""

    def __init__(self) -> None:
        self.count = 0
        self.target = math.inf
        self.done = asyncio.Event()
        self.last_at = 0.0

    def hit(self) -> None:
        self.count += 1
        self.last_at = time.monotonic()
        if self.count >= self.target:
            self.done.set()

    def expect(self, target: int) -> None:
        self.target = target
        self.done.clear()
        if self.count >= target:
            self.done.set()


# --------------------------------------------------------------------------------------------
# A raw bus socket (for registration timings and refusals, without the client's retry loop)
# --------------------------------------------------------------------------------------------


class RawBus:
    """One bare WebSocket to the leader; ``request`` sends a frame and waits for its ack."""

    def __init__(self, leader: LeaderProc):
        self.leader = leader
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.instance_id = f"bench-{uuid.uuid4().hex[:12]}"
        self.generation = ""
        self._seq = 0

    async def connect(self) -> None:
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.leader.url, headers={"Authorization": f"Bearer {SECRET}"},
                                                heartbeat=None)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            if frame.get("kind") == Kind.ACK.value:
                fut = self._pending.pop(frame.get("requestId"), None)
                if fut is not None and not fut.done():
                    fut.set_result(frame)
            elif frame.get("kind") == Kind.DELIVER.value:  # acknowledge so nothing piles up
                await self.ws.send_str(json.dumps({"kind": Kind.ACK.value, "requestId": frame["requestId"],
                                                   "ok": True}))

    async def request(self, frame: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        assert self.ws is not None
        self._seq += 1
        request_id = f"{self.instance_id}:{self._seq}"
        frame = {**frame, "requestId": request_id}
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        await self.ws.send_str(json.dumps(frame))
        return await asyncio.wait_for(fut, timeout)

    async def register(self, cwd: str) -> tuple[float, dict[str, Any]]:
        """``follower.register`` → ack; returns (seconds, ack)."""
        from topicbus.host import current_host_id, process_birth_id

        self.generation = uuid.uuid4().hex
        frame = {"kind": Kind.REGISTER.value, "instanceId": self.instance_id,
                 "registrationGeneration": self.generation, "pid": os.getpid(),
                 "processBirthId": process_birth_id(os.getpid()), "hostId": current_host_id(),
                 "cwd": cwd, "protocol": follower_identity("topicbus-bench/1")}
        started = time.perf_counter()
        answer = await self.request(frame)
        return time.perf_counter() - started, answer

    async def disconnect(self) -> tuple[float, dict[str, Any]]:
        frame = {"kind": Kind.DISCONNECT.value, "instanceId": self.instance_id,
                 "registrationGeneration": self.generation}
        started = time.perf_counter()
        answer = await self.request(frame)
        return time.perf_counter() - started, answer

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self.session is not None:
            await self.session.close()


# --------------------------------------------------------------------------------------------
# RSS sampling
# --------------------------------------------------------------------------------------------


class RssSampler:
    """Samples the leader's VmRSS every ``interval`` seconds while running; keeps the peak."""

    def __init__(self, leader: LeaderProc, interval: float = 0.05):
        self.leader = leader
        self.interval = interval
        self.peak_kb = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            rss = self.leader.rss_kb()
            if rss:
                self.peak_kb = max(self.peak_kb, rss)
            await asyncio.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        rss = self.leader.rss_kb()
        if rss:
            self.peak_kb = max(self.peak_kb, rss)
        if self._task is not None:
            self._task.cancel()


# --------------------------------------------------------------------------------------------
# Scratch space
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_dir(keep: bool = False):
    path = Path(tempfile.mkdtemp(prefix="topicbus-bench-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class Context:
    """What every benchmark gets: scratch space, the mode, the report, optional profiling."""

    workdir: Path
    quick: bool
    report: Report
    profile_dir: Path | None = None
    profiler: str = "cprofile"

    def leader(self, fake: FakeBotApi, label: str, env: dict[str, str] | None = None):
        """``async with ctx.leader(fake, "name") as leader``: a healthy leader, stopped on exit."""
        return running_leader(fake, self.workdir, label=label, profile_dir=self.profile_dir, profiler=self.profiler,
                              env=env)
