"""End-to-end harness: real ``topicbus leader`` / ``topicbus follow`` subprocesses against the fake Bot API."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import sys
import textwrap
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakebotapi import FakeBotApi
from tests.support.waiting import wait_until

TOKEN = "123456789:TEST-e2e-token-not-a-real-one"
SECRET = "e2e-bus-secret-0123456789"
OWNER_ID = 424242
CHAT_ID = -1001234567890

# An agent that answers every line and exits on "bye" with code 3; "crash" makes it SIGKILL itself.
ECHO_AGENT = textwrap.dedent("""
    import os, signal, sys
    print("agent ready", flush=True)
    for line in sys.stdin:
        line = line.rstrip("\\n")
        if line == "bye":
            print("bye!", flush=True)
            sys.exit(3)
        print("echo: " + line, flush=True)
""")


def _limit_open_files(n: int) -> None:
    """In the child before exec: ``ulimit -n n``."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _before_exec(open_files: int | None, ignored_signals: tuple[int, ...]) -> None:
    """In the child before exec: ``ulimit -n``, and signals ignored as ``trap "" SIG`` or ``nohup`` leave them."""
    if open_files is not None:
        _limit_open_files(open_files)
    for signum in ignored_signals:
        signal.signal(signum, signal.SIG_IGN)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.returncode is None:
            os.kill(self.process.pid, sig)

    async def wait(self, timeout: float = 20.0) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)


@dataclass
class Cluster:
    """One fake Telegram, one database, leaders and followers as real processes."""

    fake: FakeBotApi
    tmp: Path
    port: int = field(default_factory=free_port)
    env_overrides: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    @property
    def db_path(self) -> Path:
        return self.tmp / "topicbus.sqlite3"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICBUS_")}
        env.update({
            "TOPICBUS_BOT_TOKEN": TOKEN,
            "TOPICBUS_CHAT_ID": str(CHAT_ID),
            "TOPICBUS_OWNER_IDS": str(OWNER_ID),
            "TOPICBUS_API_BASE_URL": self.fake.base_url,
            "TOPICBUS_DB_PATH": str(self.db_path),
            "TOPICBUS_BUS_HOST": "127.0.0.1",
            "TOPICBUS_BUS_PORT": str(self.port),
            "TOPICBUS_BUS_SECRET": SECRET,
            "TOPICBUS_LEADER_URL": f"ws://127.0.0.1:{self.port}/v1/bus",
            "TOPICBUS_POLL_TIMEOUT_S": "1",
            "TOPICBUS_FOLLOWER_STALE_AFTER_MS": "1500",
            "TOPICBUS_PRUNE_INTERVAL_MS": "200",
            "TOPICBUS_HEARTBEAT_INTERVAL_MS": "200",
            "TOPICBUS_LEASE_REFRESH_MS": "300",
            "TOPICBUS_LEASE_STALE_AFTER_MS": "1500",
            "TOPICBUS_RATE_LIMIT_PER_SECOND": "1000",
            "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_MINUTE": "100000",
            "TOPICBUS_RATE_LIMIT_PER_CHAT_PER_SECOND": "1000",
            "TOPICBUS_LOG_LEVEL": "DEBUG",
            "TOPICBUS_CLEANUP_GRACE_S": "0",  # the reference's checks delete at once; grace tests set their own
        })
        env.update(self.env_overrides)
        env.update(extra)
        return env

    async def spawn(self, name: str, args: list[str], *, open_files: int | None = None,
                    ignored_signals: tuple[int, ...] = (), **env: str) -> Proc:
        """Start ``topicbus ARGS``; ``open_files`` lowers its file descriptor limit (``ulimit -n``);
        ``ignored_signals`` start it with those signals ignored (as a script's ``trap ""`` would)."""
        log_path = self.tmp / f"{name}-{len(self.procs)}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - the child owns it
        limit = (None if open_files is None and not ignored_signals
                 else functools.partial(_before_exec, open_files, ignored_signals))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "topicbus", *args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            env=self.env(**env), cwd=str(self.tmp), start_new_session=True, preexec_fn=limit)
        log.close()
        proc = Proc(name, process, log_path)
        self.procs.append(proc)
        return proc

    async def spawn_python(self, name: str, script: str, **env: str) -> Proc:
        """A Python program of the test's own (for example one using ``FollowerClient``), with the
        cluster's environment."""
        log_path = self.tmp / f"{name}-{len(self.procs)}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - the child owns it
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-u", "-c", script, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            env=self.env(**env), cwd=str(self.tmp), start_new_session=True)
        log.close()
        proc = Proc(name, process, log_path)
        self.procs.append(proc)
        return proc

    async def start_leader(self, *, open_files: int | None = None, **env: str) -> Proc:
        return await self.spawn("leader", ["leader"], open_files=open_files, **env)

    async def start_follower(self, workdir: Path, *, name: str | None = None, script: str = ECHO_AGENT,
                             **env: str) -> Proc:
        workdir.mkdir(parents=True, exist_ok=True)
        args = ["follow", "--cwd", str(workdir)]
        if name:
            args += ["--name", name]
        return await self.spawn(f"follow-{workdir.name}", [*args, "--", sys.executable, "-u", "-c", script], **env)

    def http(self, path: str, *, secret: str | None = SECRET) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if secret:
            req.add_header("Authorization", f"Bearer {secret}")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                return exc.code, json.loads(body or b"null")
            except ValueError:
                return exc.code, body.decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return 0, None

    async def status(self) -> dict[str, Any] | None:
        code, body = await asyncio.to_thread(self.http, "/v1/status")
        return body if code == 200 else None

    async def wait_for(self, predicate, timeout: float = 20.0, message: str | Callable[[], str] = "condition") -> Any:
        """``tests.support.waiting.wait_until`` with every process's log tail on failure."""
        return await wait_until(predicate, timeout=timeout, interval=0.05, message=message,
                                describe=self.diagnostics)

    async def wait_polling(self, timeout: float = 20.0) -> dict[str, Any]:
        async def ready():
            code, body = await asyncio.to_thread(self.http, "/healthz", secret=None)
            return body if code == 200 and isinstance(body, dict) and body.get("role") == "leader" else None

        return await self.wait_for(ready, timeout, "leader polling")

    async def wait_follower_topic(self, workdir: Path, timeout: float = 20.0) -> dict[str, Any]:
        async def bound():
            snap = await self.status()
            if not snap:
                return None
            for b in snap["bindings"]:
                if b["cwd"] == str(workdir) and b["state"] == "live" and b["threadId"]:
                    return b
            return None

        return await self.wait_for(bound, timeout, f"follower topic for {workdir}")

    async def leader_with_follower(self, workdir: Path, **env: str) -> tuple[Proc, Proc, int]:
        """A polling leader and one follower whose agent said it is ready; returns its thread id."""
        leader = await self.start_leader(**env)
        await self.wait_polling()
        follower = await self.start_follower(workdir, **env)
        thread = (await self.wait_follower_topic(workdir))["threadId"]
        await self.wait_text(thread, "agent ready")
        return leader, follower, thread

    def texts_in(self, thread_id: int) -> list[str]:
        return [m.text or "" for m in self.fake.messages_in(CHAT_ID, thread_id)]

    def lines_in(self, thread_id: int) -> list[str]:
        """What the topic shows, line by line (messages as last edited, text files; no end pings)."""
        return self.fake.visible_lines(CHAT_ID, thread_id)

    async def wait_text(self, thread_id: int, needle: str, timeout: float = 20.0) -> None:
        await self.wait_for(lambda: any(needle in t for t in self.texts_in(thread_id)), timeout,
                            lambda: f"{needle!r} in thread {thread_id}: {self.texts_in(thread_id)}")

    def diagnostics(self) -> str:
        parts = [f"fake: {self.fake.summary()}"]
        for p in self.procs:
            parts.append(f"--- {p.name} (pid {p.pid}, rc {p.process.returncode}) ---\n{p.log()[-4000:]}")
        return "\n".join(parts)

    async def shutdown(self) -> None:
        for p in self.procs:
            if p.process.returncode is None:
                try:
                    os.killpg(p.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                await asyncio.wait_for(p.process.wait(), 10)
            except TimeoutError:
                pass


# --- raw bus clients and a recording agent (fault and bad-input suites) -------------------------------

# An agent that appends every stdin line to the file named by $AGENT_OUT (flushed per line).
RECORDING_AGENT = textwrap.dedent("""
    import os, sys
    out = open(os.environ["AGENT_OUT"], "a", encoding="utf-8")
    print("agent ready", flush=True)
    for line in sys.stdin:
        out.write(line)
        out.flush()
""")


def recorded_lines(path: Path) -> list[str]:
    """Lines a RECORDING_AGENT wrote so far (a missing file is no lines)."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def register_frame(cwd: str | None, **fields: Any) -> dict[str, Any]:
    """A well-formed ``follower.register`` frame (fresh ids; override or add fields with ``fields``)."""
    import uuid

    from topicbus.protocol import follower_identity

    frame: dict[str, Any] = {
        "kind": "follower.register", "requestId": f"reg-{uuid.uuid4().hex}", "instanceId": f"raw-{uuid.uuid4().hex}",
        "registrationGeneration": uuid.uuid4().hex, "pid": None, "processBirthId": "raw-client",
        "hostId": "raw-test-host", "protocol": follower_identity("e2e-raw"),
    }
    if cwd is not None:
        frame["cwd"] = cwd
    frame.update(fields)
    return frame


class RawBus:
    """One authenticated WebSocket on the leader's bus, spoken frame by frame."""

    def __init__(self, session: Any, ws: Any):
        self.session = session
        self.ws = ws

    @classmethod
    async def connect(cls, cluster: Cluster, secret: str = SECRET) -> RawBus:
        import aiohttp

        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(f"ws://127.0.0.1:{cluster.port}/v1/bus", autoping=True,
                                          headers={"Authorization": f"Bearer {secret}"}, max_msg_size=0)
        except BaseException:
            await session.close()
            raise
        return cls(session, ws)

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next text frame as JSON; AssertionError when the socket closes or nothing comes."""
        import aiohttp

        msg = await asyncio.wait_for(self.ws.receive(), timeout)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"expected a text frame, got {msg.type!r} (close code {self.ws.close_code})")
        return json.loads(msg.data)

    async def request(self, frame: dict[str, Any] | str, timeout: float = 10.0) -> dict[str, Any]:
        await self.send(frame)
        return await self.recv(timeout)

    async def register(self, cwd: str | None, **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Register; returns (the frame sent, the ack's result). Fails unless the ack is ok."""
        frame = register_frame(cwd, **fields)
        reply = await self.request(frame)
        assert reply.get("ok") is True and reply.get("requestId") == frame["requestId"], reply
        return frame, reply["result"]

    async def send_text(self, registration: dict[str, Any], text: str, request_id: str) -> dict[str, Any]:
        return await self.request({"kind": "follower.send", "requestId": request_id,
                                   "instanceId": registration["instanceId"],
                                   "registrationGeneration": registration["registrationGeneration"],
                                   "message": {"type": "text", "text": text}})

    async def close(self) -> None:
        try:
            await self.ws.close()
        finally:
            await self.session.close()
