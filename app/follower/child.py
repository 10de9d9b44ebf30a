"""The child of `topicbus follow`: started on pipes or on a pseudo-terminal, its stdin, its signals.

* :func:`spawn` starts the command in a new session (its own process group), with an environment
  that carries no topicbus secret (:func:`child_environment`), on pipes (``--stderr topic`` gives
  stderr its own pipe, ``merge`` shares stdout's, ``inherit`` leaves it on follow's stderr) or on a
  pseudo-terminal (``os.openpty``, window size set with ``TIOCSWINSZ``, the terminal made the child's
  controlling terminal).
* The child starts with SIGINT, SIGQUIT, SIGTSTP and SIGPIPE at their defaults and no signal
  blocked, whatever follow inherited (an ignored SIGINT would make ``/interrupt`` do nothing).
* :class:`Child` owns the parent's ends: the output descriptors (read by :class:`FdReader`), the
  :class:`StdinWriter`, and the controls: :meth:`Child.interrupt` (SIGINT to the process group, or
  the terminal's interrupt character — Ctrl-C — under a pty), :meth:`Child.eof` (stdin closed, or
  the terminal's EOF character) and :meth:`Child.terminate` (SIGTERM, then SIGKILL after a grace).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loguru import logger

from topicbus.follower.hardening import PR_SET_PDEATHSIG, is_secret_name, prctl

__all__ = ["Child", "FdReader", "StdinClosed", "StdinStalled", "StdinWriter", "child_environment", "spawn"]

TERMINATE_GRACE_S = 5.0
READ_CHUNK_BYTES = 64 * 1024


def child_environment(environ: Mapping[str, str], *, pty: bool) -> dict[str, str]:
    """The child's environment: ``environ`` without secrets; under a pty, ``TERM`` names a terminal."""
    env = {k: v for k, v in environ.items() if not is_secret_name(k)}
    if pty:
        env["TERM"] = "xterm-256color"
    return env


class StdinClosed(Exception):
    """The child's stdin cannot take more: it was closed (``/eof``) or the child is gone."""


class StdinStalled(Exception):
    """The child did not read its stdin for the whole bounded wait; nothing of the item was written."""


class StdinWriter:
    """Writes items into the child's stdin (a pipe, or the pty's master) without blocking the loop.

    :meth:`write` returns once every byte of ``data`` is in the kernel's buffer. It waits for room
    at most ``timeout_s`` before the first byte (then :class:`StdinStalled`, nothing written); once
    an item has started, it waits until the item is complete or the child is gone. It raises
    :class:`StdinClosed` when stdin was closed or the child has exited (:meth:`mark_gone`), at once,
    even while a grandchild keeps the pipe open. Items are written one at a time."""

    def __init__(self, fd: int, *, owns_fd: bool):
        self._fd: int | None = fd
        self._owns_fd = owns_fd
        self._lock = asyncio.Lock()
        self._gone = asyncio.Event()
        self._reason = ""
        os.set_blocking(fd, False)

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def mark_gone(self, reason: str = "the child has exited") -> None:
        """Nothing more can be written (the child exited): pending and later writes fail at once."""
        if not self._gone.is_set():
            self._reason = reason
            self._gone.set()

    async def write(self, data: bytes, timeout_s: float) -> None:
        async with self._lock:
            view = memoryview(data)
            started = False
            while view:
                if self._gone.is_set() or self._fd is None:
                    raise StdinClosed(self._reason or "the child's stdin is closed")
                try:
                    written = os.write(self._fd, view)
                except BlockingIOError:
                    written = 0
                except OSError as exc:
                    if isinstance(exc, BrokenPipeError) or exc.errno in (errno.EPIPE, errno.EIO, errno.EBADF):
                        raise StdinClosed("the child's stdin is closed") from None
                    raise
                if written:
                    started = True
                    view = view[written:]
                elif not await self._writable(None if started else timeout_s):
                    raise StdinStalled(f"the child did not read its stdin for {timeout_s:g} s")

    async def wait_writable(self) -> None:
        """Wait until the child can take more input again, or is gone."""
        while not self._gone.is_set() and self._fd is not None:
            if await self._writable(5.0):
                return

    async def _writable(self, timeout: float | None) -> bool:
        """Wait for room in the buffer, or for the child to be gone; False after ``timeout``."""
        assert self._fd is not None
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self._fd
        loop.add_writer(fd, lambda: None if ready.done() else ready.set_result(None))
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            done, _ = await asyncio.wait({ready, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return bool(done)
        finally:
            loop.remove_writer(fd)
            gone.cancel()
            if not ready.done():
                ready.cancel()

    def close(self) -> None:
        """No more input (pipe mode: the child reads EOF)."""
        self.mark_gone("the child's stdin was closed (/eof)")
        if self._fd is not None and self._owns_fd:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None


class FdReader:
    """Reads one output descriptor with the event loop; ``on_data(bytes)`` per chunk, ``on_eof()`` once."""

    def __init__(self, fd: int, on_data: Callable[[bytes], None], on_eof: Callable[[], None]):
        self.fd = fd
        self._on_data = on_data
        self._on_eof = on_eof
        self.eof = False
        os.set_blocking(fd, False)
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:  # EIO: the pty's last slave descriptor was closed
            data = b""
        if data:
            self._on_data(data)
        else:
            self.stop()

    def pause(self) -> None:
        """Stop taking output for now (the child blocks once its pipe is full, as on a slow terminal)."""
        if not self.eof:
            asyncio.get_running_loop().remove_reader(self.fd)

    def resume(self) -> None:
        if not self.eof:
            asyncio.get_running_loop().add_reader(self.fd, self._readable)

    def stop(self) -> None:
        """Stop reading and close the descriptor (idempotent); ``on_eof`` runs once."""
        if self.eof:
            return
        self.eof = True
        asyncio.get_running_loop().remove_reader(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self._on_eof()


@dataclass
class Child:
    """A running child and the parent's ends of its descriptors (see the module docstring)."""

    process: asyncio.subprocess.Process
    pty: bool
    stdin_fd: int
    stdout_fd: int  # the pty's master under --pty
    stderr_fd: int | None  # its own pipe only with --stderr topic (pipe mode)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    def interrupt(self) -> None:
        """Ctrl-C: the terminal's interrupt character under a pty, else SIGINT to the process group."""
        if self.pty and self._type_control_char(termios.VINTR, b"\x03"):
            return
        self.signal(signal.SIGINT)

    def eof(self, writer: StdinWriter) -> None:
        """End of input: the terminal's EOF character under a pty (Ctrl-D), else stdin is closed."""
        if self.pty:
            self._type_control_char(termios.VEOF, b"\x04")
        else:
            writer.close()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child's process group (the child leads it), else to the child."""
        if self.exited:
            return
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    async def terminate(self, grace_s: float = TERMINATE_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns once the child is reaped."""
        if self.exited:
            return
        self.signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_s):
                await self.process.wait()
        except TimeoutError:
            logger.warning("follow: the child ignored SIGTERM for {:g} s; killing it", grace_s)
            self.signal(signal.SIGKILL)
            await self.process.wait()

    def _type_control_char(self, index: int, fallback: bytes) -> bool:
        try:
            char = termios.tcgetattr(self.stdout_fd)[6][index]
            data = char if isinstance(char, bytes) and char != b"\x00" else fallback
            os.write(self.stdout_fd, data)
            return True
        except OSError:
            return False

    def echoes_input(self) -> bool:
        """Whether what is typed now will come back as echo: the terminal echoes (ECHO), or the
        program reads keys itself (no ICANON: readline and friends draw what you type)."""
        if not self.pty:
            return False
        try:
            lflag = termios.tcgetattr(self.stdout_fd)[3]
        except OSError:
            return False
        return bool(lflag & termios.ECHO) or not (lflag & termios.ICANON)


# The signals a terminal gives a program with their default dispositions. An ignored signal survives
# exec: a `follow` started with SIGINT ignored (from a script, `nohup`, `( … & )`) would pass that on,
# and a shell keeps for its own children what it found ignored, so `/interrupt` would do nothing.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGPIPE)


def _in_child(pty: bool) -> Callable[[], None]:
    """What runs in the child between fork and exec (after setsid): the terminal's signals as a
    terminal gives them (:data:`TERMINAL_SIGNALS` back to their defaults, no signal blocked),
    SIGTERM when follow dies (even by SIGKILL: the child is in its own session, so no terminal
    signal reaches it), and under a pty the terminal (fd 0) becomes its controlling terminal."""

    def setup() -> None:
        for signum in TERMINAL_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if pty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    return setup


async def spawn(command: Sequence[str], *, cwd: str | None, stderr: str = "topic", pty: bool = False,
                size: tuple[int, int] = (80, 24), environ: Mapping[str, str] | None = None) -> Child:
    """Start ``command`` (see the module docstring). ``stderr``: ``topic``, ``merge`` or ``inherit``
    (ignored under a pty: both streams are the one screen). ``size``: (columns, rows).
    Raises what ``exec`` raises (FileNotFoundError, PermissionError)."""
    env = child_environment(os.environ if environ is None else environ, pty=pty)
    theirs: list[int] = []
    ours: list[int] = []
    try:
        if pty:
            master, slave = os.openpty()
            ours.append(master)
            theirs.append(slave)
            columns, rows = size
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
            process = await asyncio.create_subprocess_exec(
                *command, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, start_new_session=True,
                preexec_fn=_in_child(pty=True))
            return Child(process=process, pty=True, stdin_fd=master, stdout_fd=master, stderr_fd=None)
        in_read, in_write = os.pipe()
        out_read, out_write = os.pipe()
        ours += [in_write, out_read]
        theirs += [in_read, out_write]
        err_read: int | None = None
        err_target: int | None = None
        if stderr == "topic":
            err_read, err_target = os.pipe()
            ours.append(err_read)
            theirs.append(err_target)
        elif stderr == "merge":
            err_target = out_write
        process = await asyncio.create_subprocess_exec(
            *command, stdin=in_read, stdout=out_write, stderr=err_target, cwd=cwd, env=env, start_new_session=True,
            preexec_fn=_in_child(pty=False))
        return Child(process=process, pty=False, stdin_fd=in_write, stdout_fd=out_read, stderr_fd=err_read)
    except BaseException:
        for fd in ours:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    finally:
        for fd in theirs:  # the child has its copies; ours would keep EOF from ever coming
            with contextlib.suppress(OSError):
                os.close(fd)
