"""`topicbus follow` (run_follow) with a real child process against the fake leader bus."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from topicbus.follower.follow import EXIT_REFUSED, EXIT_SUPERSEDED, run_follow
from tests.fakeleader import FakeLeader
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

# Echoes stdin lines with a prefix; "big" prints 10 000 characters; "uni" writes a multi-byte text
# one byte per write; "bye" prints a last line and exits with code 3.
CHILD = r"""
import os, sys
print("ready", flush=True)
while True:
    line = sys.stdin.readline()
    if not line:
        break
    line = line.rstrip("\n")
    if line == "bye":
        print("bye!", flush=True)
        sys.exit(3)
    if line == "big":
        print("x" * 10000, flush=True)
        continue
    if line == "uni":
        for byte in "uni:\u00e9\U0001f4a1\n".encode():
            sys.stdout.buffer.write(bytes([byte]))
            sys.stdout.buffer.flush()
        continue
    if line == "pid":
        print("pid:%d" % os.getpid(), flush=True)
        continue
    print("echo:" + line, flush=True)
"""

SLEEPER = "import sys, time\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.05)\n"


@pytest.fixture
async def leader() -> AsyncIterator[FakeLeader]:
    async with FakeLeader() as server:
        yield server


def follow(leader: FakeLeader, script: str, **kwargs) -> asyncio.Task[int]:
    options = dict(leader_url=leader.url, secret=leader.secret, command=[sys.executable, "-c", script],
                   heartbeat_interval_s=0.05, flush_interval_s=0.05)
    options.update(kwargs)
    return asyncio.create_task(run_follow(**options))


def texts_containing(leader: FakeLeader, needle: str) -> list[str]:
    return [t for t in leader.sent_texts() if needle in t]


async def test_deliveries_output_and_exit_code(leader: FakeLeader, tmp_path: Path) -> None:
    task = follow(leader, CHILD, cwd=str(tmp_path), name="worker", session="s-1")
    try:
        await wait_until(lambda: leader.registered_now, timeout=5, message="registration")
        reg = leader.registrations[0]
        assert reg["cwd"] == str(tmp_path) and reg["name"] == "worker" and reg["sessionId"] == "s-1"
        assert reg["pid"] != os.getpid()
        await wait_until(lambda: texts_containing(leader, "ready"), timeout=5, message="child start output")

        await leader.deliver("pid")
        found = await wait_until(lambda: texts_containing(leader, "pid:"), timeout=5, message="pid output")
        assert found == [f"pid:{reg['pid']}"]  # the identity's pid is the child's
        assert reg["processBirthId"].startswith(f"{reg['pid']}:")

        await leader.deliver("hello\nworld\r\nagain")  # a multi-line message arrives as its lines
        await wait_until(lambda: texts_containing(leader, "echo:again"), timeout=5, message="echo")
        assert "\n".join(leader.sent_texts()).count("echo:") == 3
        assert "echo:hello\necho:world\necho:again" in "\n".join(leader.sent_texts())

        await leader.deliver(None, caption="a caption", document={"fileName": "f.txt"})
        await leader.deliver(None, document={"fileName": "f.txt"})
        def document_lines() -> list[str]:
            return [line for t in leader.sent_texts() for line in t.splitlines() if line.startswith("echo:[document")]

        await wait_until(lambda: len(document_lines()) == 2, timeout=5, message="document lines")
        # Neither can be fetched (no fileId): each is typed as failed, the caption after it.
        assert document_lines() == ["echo:[document f.txt failed] a caption", "echo:[document f.txt failed]"]

        await leader.deliver("uni")
        await wait_until(lambda: texts_containing(leader, "uni:"), timeout=5, message="multi-byte output")
        assert texts_containing(leader, "uni:") == ["uni:\u00e9\U0001f4a1"]

        before = len(leader.sent_texts())
        await leader.deliver("big")
        await wait_until(lambda: sum(t.count("x") for t in leader.sent_texts()[before:]) >= 10_000,
                         timeout=5, message="big output")
        big = leader.sent_texts()[before:]
        assert len(big) >= 3 and all(len(t) <= 4096 for t in big)
        assert "".join(big) == "x" * 10_000

        await leader.deliver("bye")
        code = await asyncio.wait_for(task, 10)
    finally:
        if not task.done():
            task.cancel()
    assert code == 3
    texts = leader.sent_texts()
    assert texts[-2] == "bye!"
    assert texts[-1].startswith("⏹ exited with code 3 after ")  # the exit notice, after all output
    order = [next(i for i, t in enumerate(texts) if needle in t)
             for needle in ("ready", "pid:", "echo:hello", "uni:", "x" * 100, "bye!")]
    assert order == sorted(order)
    assert len(leader.disconnects) == 1
    assert leader.receipts and all(r["ok"] for r in leader.receipts)
    assert len({r["requestId"] for r in leader.receipts}) == 7


async def test_child_exit_flushes_output_written_just_before(leader: FakeLeader) -> None:
    script = "import sys\nsys.stdout.write('line %d\\n' * 2000 % tuple(range(2000)))\nsys.exit(0)\n"
    code = await asyncio.wait_for(follow(leader, script, flush_interval_s=5.0), 10)
    assert code == 0
    *output, notice = leader.sent_texts()
    assert "\n".join(output).split("\n") == [f"line {i}" for i in range(2000)]
    assert all(len(t) <= 3500 for t in output)
    assert notice.startswith("⏹ exited with code 0 after ")
    assert len(leader.disconnects) == 1


async def test_wrong_secret_terminates_child_with_78(leader: FakeLeader) -> None:
    code = await asyncio.wait_for(follow(leader, SLEEPER, secret="not-the-secret"), 10)
    assert code == EXIT_REFUSED
    assert leader.registrations == []


async def test_superseded_terminates_child_with_75(leader: FakeLeader) -> None:
    task = follow(leader, SLEEPER)
    try:
        await wait_until(lambda: leader.registered_now, timeout=5, message="registration")
        await leader.supersede()
        code = await asyncio.wait_for(task, 10)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SUPERSEDED
    assert len(leader.registrations) == 1 and leader.disconnects == []


async def test_sigterm_is_forwarded_to_the_child(leader: FakeLeader) -> None:
    wrapper = (
        "import asyncio, sys\n"
        "from topicbus.follower.follow import run_follow\n"
        "sys.exit(asyncio.run(run_follow(leader_url=sys.argv[1], secret=sys.argv[2],"
        " command=[sys.executable, '-c', sys.argv[3]], heartbeat_interval_s=0.05, flush_interval_s=0.05)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", wrapper, leader.url, leader.secret, CHILD,
                                                cwd=str(ROOT), env=env, stderr=asyncio.subprocess.DEVNULL)
    try:
        await wait_until(lambda: leader.registered_now, timeout=15, message="registration")
        await leader.deliver("hi")
        await wait_until(lambda: texts_containing(leader, "echo:hi"), timeout=5, message="echo")
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 128 + signal.SIGTERM
    assert len(leader.disconnects) == 1


async def test_command_not_found_returns_127() -> None:
    code = await run_follow(leader_url="ws://127.0.0.1:9/v1/bus", secret="x" * 10,
                            command=["/nonexistent/definitely-not-a-command"])
    assert code == 127
