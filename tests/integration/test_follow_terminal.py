"""`topicbus follow` as a real process (with real children) against the fake leader bus: stderr, lines,
controls, --pty, cleaning, prompts and buttons, acknowledgement of what was written, host Ctrl-C,
secrets kept out of the child."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from topicbus.protocol import (CAP_BUTTON, CAP_BUTTONS, CAP_CONTROL, CAP_FORMAT, CAP_SCREEN_FRAMES, LEADER_CAPABILITIES,
                               LEADER_V1_CAPABILITIES)
from tests.fakeleader import FakeLeader
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FLUSH_S = 0.25  # follow's default pause before a batch is posted
START_S = 15.0  # a Python interpreter and follow starting on a busy 2-core box
TOKEN = "123456:not-a-real-bot-token"


@pytest.fixture
async def leader() -> AsyncIterator[FakeLeader]:
    async with FakeLeader(capabilities=LEADER_V1_CAPABILITIES | {CAP_BUTTONS}) as server:
        yield server


@dataclass
class Follow:
    process: asyncio.subprocess.Process
    log: Path

    async def wait(self, timeout: float = 20.0) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
async def follow(leader: FakeLeader, tmp_path: Path):
    started: list[Follow] = []

    async def start(*args: str, script: str | None = None, env: dict[str, str] | None = None,
                    secret_in_env: bool = True, registered: bool = True) -> Follow:
        command = [sys.executable, "-c", textwrap.dedent(script)] if script is not None else []
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TOPICBUS_") and k != "PYTHONUNBUFFERED"}
        environ.update(TOPICBUS_LEADER_URL=leader.url, TOPICBUS_HEARTBEAT_INTERVAL_MS="100",
                       TOPICBUS_BOT_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
        if secret_in_env:
            environ["TOPICBUS_BUS_SECRET"] = leader.secret
        environ.update(env or {})
        log = tmp_path / f"follow-{len(started)}.log"
        with open(log, "wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "topicbus", "follow", "--cwd", str(tmp_path), *args, "--", *command,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=environ, cwd=str(ROOT),
                start_new_session=True)
        proc = Follow(process, log)
        started.append(proc)
        if registered:
            await wait_until(lambda: leader.registered_now or process.returncode is not None, timeout=START_S,
                             message=lambda: f"registration; follow's log: {proc.text()[-2000:]}")
        return proc

    yield start
    for proc in started:
        if proc.process.returncode is None:
            os.killpg(proc.process.pid, signal.SIGKILL)
            await proc.process.wait()


def joined(leader: FakeLeader) -> str:
    return "\n".join(leader.sent_texts())


async def wait_text(leader: FakeLeader, needle: str, timeout: float = 5.0) -> None:
    await wait_until(lambda: needle in joined(leader), timeout=timeout,
                     message=lambda: f"{needle!r} in the topic: {leader.sent_texts()}")


def child_pid(leader: FakeLeader) -> int:
    return leader.registrations[-1]["pid"]


READY_THEN_LINES = """
    import sys
    print("ready", flush=True)
    for line in sys.stdin:
        print("got:" + line.rstrip("\\n"), flush=True)
"""


# ---- stderr, lines, exit ----------------------------------------------------------------------


async def test_stderr_is_in_the_topic_marked_and_the_exit_is_announced(leader: FakeLeader, follow) -> None:
    script = """
        import sys
        print("to stdout", flush=True)
        print("Traceback: boom", file=sys.stderr, flush=True)
        sys.exit(2)
    """
    proc = await follow(script=script)
    assert await proc.wait() == 2
    text = joined(leader)
    assert "to stdout" in text and "⚠ Traceback: boom" in text
    assert leader.sent_texts()[-1].startswith("⏹ exited with code 2 after ")
    assert len(leader.disconnects) == 1


@pytest.mark.parametrize("mode", ["merge", "inherit"])
async def test_stderr_merge_and_inherit(leader: FakeLeader, follow, mode: str) -> None:
    script = """
        import sys
        print("err line", file=sys.stderr, flush=True)
        print("out line", flush=True)
    """
    proc = await follow("--stderr", mode, script=script)
    assert await proc.wait() == 0
    text = joined(leader)
    assert "out line" in text and "⚠" not in text
    assert ("err line" in text) == (mode == "merge")
    if mode == "inherit":
        assert "err line" in proc.text()


async def test_a_three_line_message_arrives_as_three_lines(leader: FakeLeader, follow) -> None:
    await follow(script=READY_THEN_LINES)
    await wait_text(leader, "ready")
    await leader.deliver("first\nsecond\nthird")
    await wait_text(leader, "got:third")
    assert "got:first\ngot:second\ngot:third" in joined(leader)


# ---- controls ----------------------------------------------------------------------------------

TRAPS_SIGINT = """
    import signal, sys, time
    signal.signal(signal.SIGINT, lambda *_: print("interrupted", flush=True))
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
"""


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_interrupt_reaches_a_child_that_traps_sigint(leader: FakeLeader, follow, pty: bool) -> None:
    await follow(*(["--pty"] if pty else []), script=TRAPS_SIGINT)
    assert CAP_CONTROL in leader.follower_capabilities() and CAP_BUTTON in leader.follower_capabilities()
    await wait_text(leader, "ready")
    await leader.control("interrupt")
    await wait_text(leader, "interrupted", timeout=3.0)


async def test_kill_escalates_to_sigkill_and_eof_closes_stdin(leader: FakeLeader, follow) -> None:
    stubborn = """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """
    proc = await follow(script=stubborn)
    await wait_text(leader, "ready")
    await leader.control("kill")
    await wait_text(leader, "ignoring SIGTERM")
    assert await proc.wait(timeout=5.0 + START_S) == 128 + signal.SIGKILL
    assert leader.sent_texts()[-1].startswith("⏹ killed by SIGKILL after ")

    reads_to_eof = """
        import sys
        print("ready", flush=True)
        data = sys.stdin.read()
        print("eof after %d lines" % data.count("\\n"), flush=True)
    """
    for pty in (False, True):
        proc = await follow(*(["--pty"] if pty else []), script=reads_to_eof)
        await wait_text(leader, "ready")
        await leader.deliver("one line")
        await leader.control("eof")
        assert await proc.wait() == 0
        await wait_text(leader, "eof after 1 lines")


# ---- terminals -----------------------------------------------------------------------------------


async def test_pty_block_buffered_python_answers_each_message(leader: FakeLeader, follow) -> None:
    script = """
        import sys
        print("ready")
        for line in sys.stdin:
            print("answer:" + line.strip())
    """  # no flush, no -u, PYTHONUNBUFFERED unset: only a terminal makes this line-buffered
    await follow("--pty", script=script)
    await wait_text(leader, "ready", timeout=START_S)
    for question in ("q1", "q2", "q3"):
        await leader.deliver(question)
        await wait_text(leader, f"answer:{question}", timeout=2.0)
    lines = joined(leader).splitlines()
    assert not any(line.strip() in ("q1", "q2", "q3") for line in lines)  # our own input is not echoed back


COLOURS_AND_PROGRESS = r"""
    import sys, time
    print("\x1b[1;32mREADY\x1b[0m \x1b[31mred\x1b[0m", flush=True)
    for i in range(21):
        sys.stdout.write("\r[%-20s] %3d%%" % ("#" * i, i * 5))
        sys.stdout.flush()
        time.sleep(0.02)
    print(flush=True)
    for c in "|/-\\|/-\\":
        sys.stdout.write(c + "\b")
        sys.stdout.flush()
        time.sleep(0.02)
    print("spun", flush=True)
"""


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_colours_and_progress_bars_show_their_final_state(leader: FakeLeader, follow, pty: bool) -> None:
    proc = await follow(*(["--pty"] if pty else []), script=COLOURS_AND_PROGRESS)
    assert await proc.wait() == 0
    text = joined(leader)
    assert "READY red" in text and "spun" in text
    assert not any(ch in text for ch in "\x1b\r\b")
    bars = [line for line in text.splitlines() if "%" in line]
    assert bars == ["[####################] 100%"]


async def test_a_yes_no_prompt_gets_buttons_and_a_press_types_the_answer(leader: FakeLeader, follow) -> None:
    script = """
        answer = input("Delete everything? [y/N] ")
        print("answer=" + answer, flush=True)
    """
    proc = await follow(script=script)
    await wait_until(lambda: any(m.get("buttons") for m in leader.outbox_items), timeout=5,
                     message=lambda: f"a message with buttons: {leader.outbox_items}")
    prompt = next(m for m in leader.outbox_items if m.get("buttons"))
    assert prompt["text"].endswith("Delete everything? [y/N]")
    assert prompt["buttons"] == [[{"text": "Yes", "data": "y"}, {"text": "No", "data": "n"}]]
    await leader.button("y")
    assert await proc.wait() == 0
    assert "answer=y" in joined(leader)


async def test_a_prompt_printed_before_the_leader_answers_still_gets_buttons(leader: FakeLeader, follow,
                                                                             tmp_path: Path) -> None:
    # The child asks at once, while the leader is not reachable yet: the batch is ready before any
    # registration, and must still be shaped with what the leader accepts once it answers.
    printed = tmp_path / "printed"
    script = f"""
        import pathlib
        print("Overwrite config.yaml? [y/N] ", end="", flush=True)
        pathlib.Path({str(printed)!r}).touch()
        print("answer=" + input(), flush=True)
    """
    leader.capabilities = LEADER_CAPABILITIES  # buttons and formats (terminal output is monospace)
    leader.unavailable = True
    proc = await follow(script=script, registered=False)
    await wait_until(printed.exists, timeout=START_S, message=lambda: f"the prompt printed: {proc.text()[-2000:]}")
    refused = leader.rejected_upgrades
    # Two more refused connection attempts (the client backs off between them) span well over the
    # output's quiet period: the prompt's batch has been formed while nothing was registered.
    await wait_until(lambda: leader.rejected_upgrades >= refused + 2, timeout=START_S,
                     message="two more refused connection attempts")
    assert not leader.registered_now and not leader.outbox_items
    leader.unavailable = False
    await wait_until(lambda: leader.outbox_items, timeout=START_S, message="the prompt sent")
    prompt = leader.outbox_items[0]
    assert prompt["text"] == "Overwrite config.yaml? [y/N]"
    assert prompt["buttons"] == [[{"text": "Yes", "data": "y"}, {"text": "No", "data": "n"}]]
    assert prompt.get("format") == "pre"
    await leader.button("y")
    assert await proc.wait() == 0
    assert "answer=y" in joined(leader)


# ---- acknowledgement of what was written -----------------------------------------------------------


async def test_only_what_reached_stdin_is_acknowledged(leader: FakeLeader, follow) -> None:
    never_reads = """
        import time
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """
    proc = await follow(script=never_reads)
    await wait_text(leader, "ready")
    payload = "m" * 4000  # + "\n": 4001 bytes, less than PIPE_BUF: each write is all or nothing
    ids = [await leader.deliver(f"{i:04d}{payload[4:]}") for i in range(1000)]
    r, w = os.pipe()
    capacity = fcntl.fcntl(w, 1032)  # F_GETPIPE_SZ: this kernel's pipe buffer
    os.close(r), os.close(w)
    fits = capacity // 4096  # one page per write of more than half a page
    await wait_until(lambda: len(leader.receipts) >= fits, timeout=10, message="the items that fit")
    os.kill(child_pid(leader), signal.SIGKILL)
    assert await proc.wait() == 128 + signal.SIGKILL
    acknowledged = [r["requestId"] for r in leader.receipts]
    assert acknowledged == ids[:fits]  # in order, exactly the ones in the pipe; the rest stay journaled
    assert "killed by SIGKILL" in leader.sent_texts()[-1]


async def test_a_grandchild_holding_the_output_does_not_keep_follow(leader: FakeLeader, follow) -> None:
    started = asyncio.get_running_loop().time()
    proc = await _start_sh(follow, "echo started; sleep 25 & exit 3")
    pid = child_pid(leader)
    try:
        assert await proc.wait(timeout=START_S) == 3
        assert asyncio.get_running_loop().time() - started < 25  # the grandchild still sleeps
        assert "started" in joined(leader)
        assert leader.sent_texts()[-1].startswith("⏹ exited with code 3 after ")
        assert len(leader.disconnects) == 1
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the background sleep, in the child's process group
        except ProcessLookupError:
            pass


async def _start_sh(follow, command: str) -> Follow:
    """follow -- sh -c COMMAND (through python's exec, so the fixture's one command form serves)."""
    return await follow(script=f"import os; os.execvp('sh', ['sh', '-c', {command!r}])")


def _gone(pid: int) -> bool:
    """The process exited (reaped, or a zombie waiting for follow to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


async def test_messages_after_the_child_exited_are_not_acknowledged(leader: FakeLeader, follow) -> None:
    # The background loop keeps printing for ever: follow reads it for a bounded time after the
    # shell exits, which leaves a window in which messages still arrive.
    proc = await _start_sh(follow, "(while :; do echo tick; sleep 0.05; done) & read line; exit 3")
    pid = child_pid(leader)
    try:
        await wait_text(leader, "tick")
        first = await leader.deliver("go")  # read by the shell, which exits
        await wait_until(lambda: _gone(pid), timeout=5, message="the shell's exit")
        later = [await leader.deliver(f"after {i}") for i in range(5)]
        assert await proc.wait(timeout=START_S) == 3
        acknowledged = [r["requestId"] for r in leader.receipts]
        assert first in acknowledged and not set(later) & set(acknowledged)
        assert leader.sent_texts()[-1].startswith("⏹ exited with code 3 after ")
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- host signals, secrets -------------------------------------------------------------------------


async def test_host_ctrl_c_goes_to_the_child_and_twice_ends_follow(leader: FakeLeader, follow) -> None:
    proc = await follow(script=TRAPS_SIGINT)
    await wait_text(leader, "ready")
    proc.process.send_signal(signal.SIGINT)
    await wait_text(leader, "interrupted")
    assert proc.process.returncode is None
    proc.process.send_signal(signal.SIGINT)
    proc.process.send_signal(signal.SIGINT)  # the second within 2 s: follow ends as on SIGTERM
    assert await proc.wait() == 128 + signal.SIGTERM
    assert leader.sent_texts()[-1].startswith("⏹ killed by SIGTERM after ")
    assert len(leader.disconnects) == 1


SHOWS_ENV = """
    import os
    print("secret in env:", "TOPICBUS_BUS_SECRET" in os.environ, flush=True)
    print("token in env:", "TOPICBUS_BOT_TOKEN" in os.environ, flush=True)
    print("leader url in env:", "TOPICBUS_LEADER_URL" in os.environ, flush=True)
"""


async def test_the_child_environment_has_no_secrets(leader: FakeLeader, follow) -> None:
    proc = await follow(script=SHOWS_ENV)
    assert await proc.wait() == 0
    text = joined(leader)
    assert "secret in env: False" in text and "token in env: False" in text
    assert "leader url in env: True" in text


async def test_secret_file_and_the_warning_for_secret(leader: FakeLeader, follow, tmp_path: Path) -> None:
    secret_file = tmp_path / "bus-secret"
    secret_file.write_text(leader.secret + "\n")
    proc = await follow("--secret-file", str(secret_file), script=SHOWS_ENV, secret_in_env=False)
    assert await proc.wait() == 0
    assert "secret in env: False" in joined(leader)
    assert "warning" not in proc.text()

    proc = await follow("--secret", leader.secret, script=SHOWS_ENV, secret_in_env=False)
    assert await proc.wait() == 0
    assert "warning: --secret is visible" in proc.text()
    assert leader.secret not in proc.text()


async def test_secret_fd_refuses_what_it_cannot_use_and_says_why(leader: FakeLeader, follow, tmp_path: Path) -> None:
    not_open = 97
    proc = await follow("--secret-fd", str(not_open), script="print('never')", secret_in_env=False,
                        registered=False)
    assert await proc.wait() == 2
    assert f"--secret-fd: cannot read descriptor {not_open} (Bad file descriptor)" in proc.text()

    secret_file = tmp_path / "bus-secret"
    secret_file.write_text(leader.secret)
    proc = await follow("--secret-fd", "0", "--secret-file", str(secret_file), script="print('never')",
                        secret_in_env=False, registered=False)
    assert await proc.wait() == 2
    assert "--secret-file and --secret-fd exclude each other" in proc.text()

    proc = await follow("--secret-fd", "0", script="print('never')", secret_in_env=False, registered=False)
    assert await proc.wait() == 2  # follow's stdin is /dev/null here: nothing to read
    assert "--secret-fd: descriptor 0 is empty" in proc.text()
    assert not leader.registered_now and "never" not in joined(leader)


async def test_pty_size_is_configurable(leader: FakeLeader, follow) -> None:
    script = """
        import os
        size = os.get_terminal_size()
        print("size %dx%d" % (size.columns, size.lines))
    """
    proc = await follow("--pty", "--pty-size", "100x30", script=script)
    assert await proc.wait() == 0
    assert "size 100x30" in joined(leader)


async def test_the_hand_off_is_bounded_only_while_the_leader_is_unreachable(leader: FakeLeader,
                                                                           tmp_path: Path) -> None:
    from topicbus.follower.follow import run_follow

    go = tmp_path / "go"
    script = (f"import os, time\nprint('ready', flush=True)\nwhile not os.path.exists({str(go)!r}):\n"
              "    time.sleep(0.02)\nprint('last words', flush=True)\n")
    task = asyncio.create_task(run_follow(
        leader_url=leader.url, secret=leader.secret, command=[sys.executable, "-c", script],
        heartbeat_interval_s=0.05, flush_interval_s=0.05, handoff_timeout_s=1.0))
    try:
        await wait_text(leader, "ready")
        leader.unavailable = True  # the leader cannot be reached ...
        await leader.drop()
        go.touch()  # ... when the child says its last words and exits
        assert await asyncio.wait_for(task, 1.0 + START_S) == 0  # gave up on the leader, kept the child's code
    finally:
        if not task.done():
            task.cancel()
    assert "last words" not in joined(leader) and leader.disconnects == []


async def test_a_full_backlog_at_the_leader_blocks_the_child_like_a_slow_terminal(leader: FakeLeader, follow,
                                                                                  tmp_path: Path) -> None:
    """While the leader answers backlog-full, follow stops reading: the child blocks on its pipe
    instead of follow piling output up or dropping it; when the backlog drains, everything arrives."""
    progress = tmp_path / "progress"
    leader.send_errors = ["backlog-full"] * 100_000
    proc = await follow(script=f"""
        import sys
        for i in range(4000):
            sys.stdout.write(f"{{i:05d}} " + "x" * 1000 + "\\n")
            sys.stdout.flush()
            open({str(progress)!r}, "w").write(str(i))
    """)
    await wait_until(lambda: progress.exists() and int(progress.read_text() or 0) > 100, timeout=START_S,
                     message="the child printing")
    # Held back: the child sleeps inside write(2) on its full pipe, and cannot have got far beyond
    # follow's hold (256 KiB) plus the pipe (64 KiB).
    pid = child_pid(leader)
    await wait_until(lambda: _blocked_writing(pid), timeout=20, message="the child blocked on its pipe")
    assert int(progress.read_text()) < 1000, progress.read_text()
    leader.send_errors.clear()  # Telegram caught up: the backlog drains
    assert await proc.wait(timeout=60) == 0
    lines = [line for line in joined(leader).split("\n") if line[:5].isdigit()]
    assert [int(line[:5]) for line in lines] == list(range(4000))  # nothing dropped, in order


_WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}  # write(2)'s number, as /proc/<pid>/syscall shows it


def _blocked_writing(pid: int) -> bool:
    """The process sleeps inside write(2): a full pipe holds it, as a slow terminal would."""
    import platform

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return state == "S" and syscall == str(_WRITE_SYSCALL[platform.machine()])


SMALL_DASHBOARD = """
    import sys, time
    sys.stdout.write("\\x1b[?1049h")
    for n in range(4):
        sys.stdout.write("\\x1b[H\\x1b[2JDASHBOARD header\\r\\n\\r\\ncounter %d" % n)
        sys.stdout.flush()
        time.sleep(1.2)
    sys.stdout.write("\\x1b[?1049l")
    sys.stdout.flush()
"""


@pytest.mark.parametrize("frames", [True, False], ids=["screen-frames-v1", "older-leader"])
async def test_a_full_screen_program_sends_frames_only_to_a_leader_that_takes_them(
        leader: FakeLeader, follow, frames: bool) -> None:
    if frames:
        leader.capabilities = leader.capabilities | {CAP_FORMAT, CAP_SCREEN_FRAMES}
    proc = await follow("--pty", script=SMALL_DASHBOARD)
    assert await proc.wait(timeout=30) == 0
    await wait_text(leader, "⏹ exited with code 0")
    shown = [m for m in leader.outbox_items if m.get("type") == "text" and "DASHBOARD" in m["text"]]
    assert shown, leader.sent_texts()
    assert shown[-1]["text"].splitlines()[0] == "DASHBOARD header"  # the whole screen, its first row too
    assert shown[-1]["text"].splitlines()[-1] == "counter 3"  # the final frame
    if frames:
        assert all(m.get("screen") is True and m.get("format") == "pre" for m in shown)
        assert len(shown) >= 3  # a new frame a second: the leader keeps only the newest
        assert [m["text"] for m in leader.outbox_items if "DASHBOARD" not in m.get("text", "")][:-1] == []
    else:
        assert not any("screen" in m for m in leader.outbox_items)  # never a field this leader did not advertise
        assert len(shown) <= 3  # snapshots at most every 3 s


CLEARS_THEN_PRINTS_LINES = """
    import sys, time
    sys.stdout.write("\\x1b[H\\x1b[2Jstatus board\\r\\n")
    sys.stdout.flush()
    time.sleep(1.5)
    for i in range(1, 41):
        sys.stdout.write("%d\\r\\n" % i)
    sys.stdout.flush()
    time.sleep(0.5)
"""


async def test_a_cleared_screen_that_scrolls_again_ends_with_its_frame_and_every_line_follows_in_order(
        leader: FakeLeader, follow) -> None:
    leader.capabilities = leader.capabilities | {CAP_FORMAT, CAP_SCREEN_FRAMES}
    proc = await follow("--pty", script=CLEARS_THEN_PRINTS_LINES)
    assert await proc.wait(timeout=30) == 0
    await wait_text(leader, "⏹ exited with code 0")
    items = [m for m in leader.outbox_items if m.get("type") == "text" and not m["text"].startswith("⏹")]
    frames = [m for m in items if m.get("screen")]
    assert frames and frames[0]["text"] == "status board"
    final = frames[-1]["text"].splitlines()
    assert final[0] == "status board"
    after = [m["text"] for m in items[items.index(frames[-1]) + 1:]]
    assert not any(m.get("screen") for m in items[items.index(frames[-1]) + 1:])
    shown = [line for line in final[1:] + "\n".join(after).splitlines() if line.strip()]
    assert shown == [str(i) for i in range(1, 41)]  # each line once, in order: the frame's, then the rest
