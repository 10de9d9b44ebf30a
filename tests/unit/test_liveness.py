"""topicbus.host against real subprocesses (and a fake /proc tree for parsing edge cases)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from topicbus.host import (
    Liveness,
    ProcessLiveness,
    compute_host_id,
    current_host_id,
    parse_birth_id,
    process_birth_id,
    process_start_ticks,
)
from tests.support.waiting import wait_until

HOST = current_host_id()


@pytest.fixture
def sleeper():
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        # A child that waits for a signal (the test kills it); never a fixed sleep.
        proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rpartition(")")[2].split()[0]


async def _wait_for_state(pid: int, wanted: str, timeout: float = 5.0) -> None:
    await wait_until(lambda: _state(pid) == wanted, timeout=timeout,
                     message=lambda: f"pid {pid} in state {wanted!r} (now {_state(pid)!r})")


# --- identity --------------------------------------------------------------------------------


def test_host_id_is_stable_cached_and_shared_with_children():
    assert re.fullmatch(r"[0-9a-f]{32}", HOST)
    assert current_host_id() is HOST  # cached
    child = subprocess.run(
        [sys.executable, "-c", "from topicbus.host import current_host_id; print(current_host_id())"],
        capture_output=True, text=True, check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert child.stdout.strip() == HOST


def test_host_id_depends_on_every_part():
    base = compute_host_id("m", "boot", "pid:[1]")
    assert base == compute_host_id("m", "boot", "pid:[1]")
    assert base != compute_host_id("m", "boot", "pid:[2]")  # another pid namespace
    assert base != compute_host_id("m", "reboot", "pid:[1]")  # after a reboot
    assert base != compute_host_id("other", "boot", "pid:[1]")  # another machine
    assert compute_host_id("", "boot", "") != compute_host_id("", "boot", "pid:[1]")
    # nothing readable: a random id that never matches anything
    blind = compute_host_id("m", "", "")
    assert blind != compute_host_id("m", "", "") and blind.startswith("unverifiable-")


def test_birth_ids():
    own = process_birth_id()
    pid, ticks = parse_birth_id(own)
    assert pid == os.getpid() and ticks == process_start_ticks(os.getpid()) and ticks > 0
    assert process_birth_id(os.getpid()) == own
    assert parse_birth_id("12:start:34") == (12, 34)
    for bad in (None, 12, "", "12:start:", "12:start:x", "012:start:3", "0:start:1", "-1:start:1",
                "12:unverifiable:abc", "12:start:3 ", " 12:start:3", "12:START:3", "١٢:start:3"):
        assert parse_birth_id(bad) is None, bad


def test_birth_id_of_a_missing_process_is_unverifiable(sleeper):
    proc = sleeper()
    proc.kill()
    proc.wait()
    assert process_start_ticks(proc.pid) is None
    birth = process_birth_id(proc.pid)
    assert birth.startswith(f"{proc.pid}:unverifiable:")
    assert parse_birth_id(birth) is None
    assert ProcessLiveness(HOST).probe(proc.pid, birth, HOST) is Liveness.UNKNOWN


# --- the port against real processes ---------------------------------------------------------


def test_live_process_is_alive_then_dead_after_sigkill(sleeper):
    proc = sleeper()
    birth = process_birth_id(proc.pid)
    port = ProcessLiveness(HOST)
    assert port.probe(proc.pid, birth, HOST) is Liveness.ALIVE
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert port.probe(proc.pid, birth, HOST) is Liveness.DEAD


async def test_zombie_is_dead(sleeper):
    proc = sleeper()
    birth = process_birth_id(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    await _wait_for_state(proc.pid, "Z")  # exited, not yet reaped: /proc/<pid> still exists
    assert ProcessLiveness(HOST).probe(proc.pid, birth, HOST) is Liveness.DEAD


async def test_stopped_process_is_alive(sleeper):
    proc = sleeper()
    birth = process_birth_id(proc.pid)
    os.kill(proc.pid, signal.SIGSTOP)
    await _wait_for_state(proc.pid, "T")
    assert ProcessLiveness(HOST).probe(proc.pid, birth, HOST) is Liveness.ALIVE
    # cleanup (SIGCONT + kill) happens in the fixture


def test_pid_reuse_is_dead(sleeper):
    proc = sleeper()
    ticks = process_start_ticks(proc.pid)
    reused = f"{proc.pid}:start:{ticks + 1}"  # same pid, another process's start time
    assert ProcessLiveness(HOST).probe(proc.pid, reused, HOST) is Liveness.DEAD


def test_other_host_or_missing_host_is_unknown(sleeper):
    proc = sleeper()
    birth = process_birth_id(proc.pid)
    port = ProcessLiveness(HOST)
    assert port.probe(proc.pid, birth, "0" * 32) is Liveness.UNKNOWN
    assert port.probe(proc.pid, birth, None) is Liveness.UNKNOWN
    assert port.probe(proc.pid, birth, "") is Liveness.UNKNOWN
    assert ProcessLiveness("").probe(proc.pid, birth, "") is Liveness.UNKNOWN
    proc.kill()
    proc.wait()
    # even a provably gone process is never DEAD across hosts
    assert port.probe(proc.pid, birth, "0" * 32) is Liveness.UNKNOWN


@pytest.mark.parametrize("pid", [0, -1, None, True, False, 1.0, "123", 2**40])
def test_unsafe_pids_are_unknown(pid):
    assert ProcessLiveness(HOST).probe(pid, f"{pid}:start:1", HOST) is Liveness.UNKNOWN


def test_malformed_or_mismatched_birth_id_is_unknown(sleeper):
    proc = sleeper()
    birth = process_birth_id(proc.pid)
    port = ProcessLiveness(HOST)
    other_pid = proc.pid + 1
    for bad in (None, "", "garbage", f"{proc.pid}:start:", f"{proc.pid}:unverifiable:abc",
                f"{other_pid}:{birth.split(':', 1)[1]}", 12345):
        assert port.probe(proc.pid, bad, HOST) is Liveness.UNKNOWN, bad


def test_probe_record(sleeper):
    proc = sleeper()
    record = SimpleNamespace(pid=proc.pid, process_birth_id=process_birth_id(proc.pid), host_id=HOST)
    assert ProcessLiveness(HOST).probe_record(record) is Liveness.ALIVE
    assert ProcessLiveness(HOST).probe_record(object()) is Liveness.UNKNOWN


def test_hidden_proc_entry_of_a_live_process_is_unknown(sleeper, tmp_path):
    """A /proc that hides the pid (hidepid, empty mount) must not make a live process DEAD."""
    proc = sleeper()
    birth = process_birth_id(proc.pid)
    empty_proc = ProcessLiveness(HOST, proc_root=str(tmp_path), signal_check=True)
    assert empty_proc.probe(proc.pid, birth, HOST) is Liveness.UNKNOWN
    proc.kill()
    proc.wait()
    assert empty_proc.probe(proc.pid, birth, HOST) is Liveness.DEAD


def test_missing_proc_root_is_unknown(tmp_path):
    port = ProcessLiveness("h" * 32, proc_root=str(tmp_path / "no-proc"))
    assert port.probe(4242, "4242:start:7", "h" * 32) is Liveness.UNKNOWN


# --- parsing with a fake /proc ---------------------------------------------------------------


def _stat_line(pid: int, comm: str, state: str, starttime: int) -> str:
    # fields 4..21 are filler, field 22 is starttime, then a few more
    filler = " ".join(str(n) for n in range(4, 22))
    return f"{pid} ({comm}) {state} {filler} {starttime} 99 100 101\n"


@pytest.fixture
def fake_proc(tmp_path):
    def add(pid: int, content: str | None) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        if content is None:
            (d / "stat").mkdir()  # unreadable as a file
        else:
            (d / "stat").write_text(content)

    return tmp_path, add


def test_fake_proc_parses_comm_with_spaces_and_parens(fake_proc):
    root, add = fake_proc
    add(4242, _stat_line(4242, "my (weird) proc) 1 2 3", "S", 777))
    assert process_start_ticks(4242, proc_root=str(root)) == 777
    port = ProcessLiveness("h" * 32, proc_root=str(root))
    assert port.signal_check is False
    assert port.probe(4242, "4242:start:777", "h" * 32) is Liveness.ALIVE
    assert port.probe(4242, "4242:start:778", "h" * 32) is Liveness.DEAD  # reused pid
    assert port.probe(4343, "4343:start:777", "h" * 32) is Liveness.DEAD  # no such pid


def test_fake_proc_unreadable_or_malformed_stat_is_unknown(fake_proc):
    root, add = fake_proc
    add(10, None)  # stat is a directory: read fails with EISDIR
    add(11, "11 (truncated) S 1 2 3\n")
    add(12, "no parentheses at all\n")
    add(13, _stat_line(13, "x", "S", 5).replace(" 5 99", " five 99"))
    add(14, _stat_line(14, "x", "Z", 5))
    port = ProcessLiveness("h" * 32, proc_root=str(root))
    for pid in (10, 11, 12, 13):
        assert process_start_ticks(pid, proc_root=str(root)) is None
        assert port.probe(pid, f"{pid}:start:5", "h" * 32) is Liveness.UNKNOWN, pid
    assert port.probe(14, "14:start:5", "h" * 32) is Liveness.DEAD  # zombie


