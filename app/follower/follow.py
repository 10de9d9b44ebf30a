"""``topicbus follow -- CMD ARGS…``: run a command as a child and attach it to the leader as one follower.

The parts, by role: :mod:`~topicbus.follower.child` (the child on pipes or a pty, its stdin, its
signals), :mod:`~topicbus.follower.inputs` (what a message types), :mod:`~topicbus.follower.output`
and :mod:`~topicbus.follower.terminal` (pipe-mode cleaning, pty rendering through pyte, batches,
yes/no prompts), :mod:`~topicbus.follower.capture` (reading, and posting in order),
:mod:`~topicbus.follower.posting` (each post shaped with what the leader accepts); this module runs
them: :class:`FollowRun`, one run's named steps, and :class:`HostSignals`.

* Every owner message becomes its lines on the child's stdin, followed by a newline. It is
  acknowledged only once all its bytes are in the child's stdin; what cannot be written (stdin
  closed, the child gone, or not read for ``stdin_timeout_s``) stays unacknowledged, so the leader
  keeps it for the next follower of the workspace.
* ``control`` deliveries: ``interrupt`` (SIGINT to the child's process group; Ctrl-C on its pty),
  ``kill`` (SIGTERM, then SIGKILL after 5 s), ``eof`` (stdin closed; the EOF character on a pty),
  and with ``--pty`` ``screen`` (``/screen``: the terminal's screen posted as a PNG,
  :mod:`~topicbus.follower.screenshot`; follow advertises ``screen-v1`` only with ``--pty``).
  ``button`` deliveries type their data as a line (the Yes/No buttons of a prompt).
* Host signals: the first SIGINT goes to the child; a second within 2 s ends follow the way SIGTERM
  does: the child gets SIGTERM, then SIGKILL after 5 s, and follow hands its output over and exits.
  SIGHUP does the same. The child runs in its own session, so a terminal's signals reach it only
  through follow; if follow itself is killed, the child gets SIGTERM (``PR_SET_PDEATHSIG``).
* The follower identity's ``pid`` is the **child's** pid (with the child's birth id).
* When the child exits, follow stops taking deliveries at once, reads what is left of the output
  (bounded: a grandchild may hold it open), hands it all to the leader, posts ``⏹ exited with code
  N`` (or ``killed by SIGNAME``) with the run time, disconnects gracefully and returns the child's
  exit code (``128 + N`` for a death by signal ``N``). Only while the leader is unreachable is that
  hand-off bounded (``handoff_timeout_s``); a signal during it abandons what is left.
* Superseded → the child is terminated and the exit code is :data:`EXIT_SUPERSEDED` (75); refused
  (wrong secret, incompatible protocol) → the same, with :data:`EXIT_REFUSED` (78).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from loguru import logger

from topicbus.follower.capture import OutputCapture
from topicbus.follower.child import Child, StdinClosed, StdinStalled, StdinWriter, spawn
from topicbus.follower.client import FollowerClient
from topicbus.follower.inputs import (INBOX_DIR, context_line, delivery_input, delivery_text, edit_text,
                                      save_document, save_files, save_transcribed, transcript_text)
from topicbus.follower.model import (ButtonPress, Control, Delivery, DeliveryDeclined, Edit, FollowerError,
                                     FollowerSuperseded)
from topicbus.follower.output import OutputBatcher
from topicbus.follower.posting import OutputPoster
from topicbus.follower.terminal import ScreenRenderer
from topicbus.protocol import CAP_TAIL, TextFormat

EXIT_SUPERSEDED = 75  # EX_TEMPFAIL: another follower took this workspace over
EXIT_REFUSED = 78  # EX_CONFIG: wrong secret or incompatible protocol
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
DOUBLE_INTERRUPT_S = 2.0  # a second host Ctrl-C within this ends follow
STDERR_MODES = ("topic", "merge", "inherit")
FORMATS: tuple[TextFormat, ...] = ("pre", "plain", "markdown")
#: The pty's size under --pty: wide enough that output lines are rarely wrapped, and a full screen
#: (160 × 25) still fits one 4,096-character message.
DEFAULT_PTY_SIZE = (160, 25)
#: How often the hand-off checks whether the leader is still unreachable.
HANDOFF_CHECK_S = 0.25

T = TypeVar("T")


def exit_code_of(returncode: int) -> int:
    """A child's exit status as a shell would report it (``128 + N`` for death by signal ``N``)."""
    return 128 - returncode if returncode < 0 else returncode


def format_duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    total = int(round(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"


def exit_notice(returncode: int, ran_s: float) -> str:
    """``⏹ exited with code N`` or ``⏹ killed by SIGNAME``, and how long the child ran."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        what = f"killed by {name}"
    else:
        what = f"exited with code {returncode}"
    return f"⏹ {what} after {format_duration(ran_s)}"


def fatal_exit_code(error: BaseException) -> int:
    """The exit code of a follow ended by a terminal failure of its client."""
    return EXIT_SUPERSEDED if isinstance(error, FollowerSuperseded) else EXIT_REFUSED


@dataclass(frozen=True)
class FollowSettings:
    """What one ``topicbus follow`` run was asked to do (the options of :func:`run_follow`)."""

    leader_url: str
    secret: str
    command: Sequence[str]
    cwd: str | None
    name: str | None
    session: str | None
    heartbeat_interval_s: float
    flush_interval_s: float
    max_delay_s: float
    max_batch_chars: int
    stderr: str
    pty: bool
    pty_size: tuple[int, int]
    text_format: TextFormat
    end_blocks: bool
    context: bool
    stdin_timeout_s: float
    handoff_timeout_s: float
    snapshot_interval_s: float
    ca_file: str | None

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("follow needs a command to run")
        if self.stderr not in STDERR_MODES:
            raise ValueError(f"stderr must be one of {', '.join(STDERR_MODES)}")
        if self.text_format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")


async def run_follow(
    *,
    leader_url: str,
    secret: str,
    command: Sequence[str],
    cwd: str | None = None,
    name: str | None = None,
    session: str | None = None,
    heartbeat_interval_s: float = 1.0,
    flush_interval_s: float = 0.25,
    max_delay_s: float = 1.0,
    max_batch_chars: int = 3500,
    stderr: str = "topic",
    pty: bool = False,
    pty_size: tuple[int, int] = DEFAULT_PTY_SIZE,
    text_format: TextFormat = "pre",
    end_blocks: bool = False,
    context: bool = False,
    stdin_timeout_s: float = 30.0,
    handoff_timeout_s: float = 60.0,
    snapshot_interval_s: float = 3.0,
    ca_file: str | None = None,
) -> int:
    """Run ``command`` as a follower (see the module docstring) and return the exit code to use."""
    settings = FollowSettings(
        leader_url=leader_url, secret=secret, command=command, cwd=cwd, name=name, session=session,
        heartbeat_interval_s=heartbeat_interval_s, flush_interval_s=flush_interval_s, max_delay_s=max_delay_s,
        max_batch_chars=max_batch_chars, stderr=stderr, pty=pty, pty_size=pty_size, text_format=text_format,
        end_blocks=end_blocks, context=context, stdin_timeout_s=stdin_timeout_s,
        handoff_timeout_s=handoff_timeout_s, snapshot_interval_s=snapshot_interval_s, ca_file=ca_file,
    )
    started_at = asyncio.get_running_loop().time()
    child = await start_child(settings)
    if isinstance(child, int):
        return child
    return await FollowRun(settings, child, started_at=started_at).run()


async def start_child(settings: FollowSettings) -> Child | int:
    """The child, started; else the exit code of a command that cannot run (127 not found, 126 not executable)."""
    command = settings.command
    try:
        child = await spawn(command, cwd=settings.cwd, stderr=settings.stderr, pty=settings.pty,
                            size=settings.pty_size)
    except FileNotFoundError:
        logger.error("follow: command not found: {}", command[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        logger.error("follow: command not executable: {}", command[0])
        return EXIT_NOT_EXECUTABLE
    logger.info("follow: started child pid {}{}", child.pid, " on a pty" if settings.pty else "")
    return child


class FollowRun:
    """One ``topicbus follow`` run of a started child, from attaching it to the leader to its exit code.

    :meth:`run` takes the steps in order: :meth:`_start` (host signals to the child, the output
    pumped to the topic by the :class:`~topicbus.follower.posting.OutputPoster`), the client started
    (it registers with the child's pid), then, when the child exits, :meth:`_finish` (the rest of
    the output and the exit notice handed over), or, when the client fails for good,
    :meth:`_give_up` (the child terminated); :meth:`_clean_up` always. Meanwhile the client hands
    the owner's deliveries to :meth:`type_delivery`, :meth:`type_edit`, :meth:`type_button_press`
    and :meth:`apply_control`.
    """

    def __init__(self, settings: FollowSettings, child: Child, *, started_at: float):
        self._settings = settings
        self._child = child
        self._started_at = started_at
        self._loop = asyncio.get_running_loop()
        pty = settings.pty
        self._writer = StdinWriter(child.stdin_fd, owns_fd=not pty)
        self._renderer = (ScreenRenderer(*settings.pty_size, quiet_s=settings.flush_interval_s,
                                         snapshot_interval_s=settings.snapshot_interval_s) if pty else None)
        batcher = OutputBatcher(max_batch_chars=settings.max_batch_chars, flush_interval_s=settings.flush_interval_s,
                                max_delay_s=settings.max_delay_s)
        self._capture = OutputCapture(
            child, batcher, renderer=self._renderer, quiet_s=settings.flush_interval_s,
            leader_reachable=lambda: self._client.registered,
            # Before the leader answered, nothing is posted yet: a line being redrawn is held for a
            # tail rather than posted as a partial that no tail could replace.
            live_tails=lambda: CAP_TAIL in self._client.leader_capabilities or not self._client.registered)
        self._workdir = os.path.abspath(settings.cwd) if settings.cwd else os.getcwd()
        self._inbox = os.path.join(self._workdir, INBOX_DIR)
        self._watched: list[asyncio.Task[Any]] = []  # the run's own tasks (see _start)
        self._background: set[asyncio.Task[Any]] = set()  # controls, signals and stalls acted on
        self._stalled = asyncio.Event()  # input waits for the child to read its stdin again
        self._client = FollowerClient(
            leader_url=settings.leader_url, secret=settings.secret, on_delivery=self.type_delivery,
            on_control=self.apply_control, on_button=self.type_button_press,
            on_edit=self.type_edit if settings.context else None, media=True, screenshots=pty, cwd=self._workdir,
            session_id=settings.session, name=settings.name, pid=child.pid,
            heartbeat_interval_s=settings.heartbeat_interval_s, ca_file=settings.ca_file,
            # A reachable leader whose outbox for this agent is full is backpressure, never a reason to
            # drop output: a send waits until the outbox has room (the capture stops reading meanwhile).
            backlog_wait_s=math.inf,
        )
        self._poster = OutputPoster(self._client, text_format=settings.text_format, renderer=self._renderer,
                                    snapshot_interval_s=settings.snapshot_interval_s)
        self._signals = HostSignals(child, self._in_background)

    # ---- the run --------------------------------------------------------------------------------

    async def run(self) -> int:
        """Follow the child until it exits or the client fails for good; the exit code to use."""
        self._start()
        try:
            await self._client.start()  # registers (again and again, if need be) with the child's pid
            await asyncio.wait({self._exited, self._failed}, return_when=asyncio.FIRST_COMPLETED)
            if not self._exited.done():
                return await self._give_up(self._failed.result())
            return await self._finish(self._exited.result())
        finally:
            await self._clean_up()

    def _start(self) -> None:
        """Host signals to the child; the output pumped to the topic; the child's exit, the client's
        failure and an abandoned hand-off watched."""
        self._signals.install()
        poster = self._poster
        self._pumping = self._watch(self._capture.post_loop(
            poster.post_batch, poster.post_tail, poster.post_frame if self._settings.pty else None), "follow-poster")
        self._exited = self._watch(self._child.process.wait(), "follow-child")
        self._failed = self._watch(self._client.wait_failure(), "follow-failure")
        self._aborted = self._watch(self._signals.aborted.wait(), "follow-abort")

    async def _give_up(self, error: FollowerError) -> int:
        """The client failed for good (superseded, refused): the child is terminated."""
        logger.error("follow: {}; terminating the child", error)
        await self._child.terminate()
        return fatal_exit_code(error)

    async def _finish(self, returncode: int) -> int:
        """The child exited: take nothing more, read what is left of its output, hand it over with the
        exit notice, and return the exit code."""
        self._client.stop_receiving()
        self._writer.mark_gone()
        code = exit_code_of(returncode)
        logger.info("follow: child exited with {}; handing its output to the leader", code)
        await self._capture.drain_after_exit()
        self._capture.finish()
        handoff = self._watch(self._hand_off(returncode), "follow-handoff")
        outcome = await self._wait_for_handoff(handoff)
        return code if outcome is None else outcome

    async def _hand_off(self, returncode: int) -> None:
        await self._pumping
        notice = exit_notice(returncode, self._loop.time() - self._started_at)
        logger.info("follow: {}", notice)
        await self._poster.post_exit_notice(notice)

    async def _wait_for_handoff(self, handoff: asyncio.Task[None]) -> int | None:
        """Wait for the hand-off; None when it completed or was abandoned, else the exit code to use.
        The wait is bounded only while the leader is unreachable (``handoff_timeout_s`` in total)."""
        client, loop, failed = self._client, self._loop, self._failed
        limit_s = self._settings.handoff_timeout_s
        unreachable = 0.0
        while True:
            before = loop.time()
            registered = client.registered
            done, _ = await asyncio.wait({handoff, failed, self._aborted}, timeout=HANDOFF_CHECK_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not registered and not client.registered:
                unreachable += loop.time() - before
            if handoff in done:
                error = handoff.exception()
                if isinstance(error, FollowerError) and client.failure is not None:
                    return fatal_exit_code(client.failure)
                if error is not None:
                    logger.opt(exception=error).error("follow: handing the output over failed")
                return None
            if failed in done and not failed.cancelled() and failed.exception() is None:
                logger.error("follow: {}; output still pending was not posted", failed.result())
                return fatal_exit_code(failed.result())
            if self._aborted in done:
                logger.warning("follow: output not handed over (abandoned)")
                return None
            if unreachable >= limit_s:
                logger.warning("follow: the leader was unreachable for {:g} s; output not handed over", unreachable)
                return None

    async def _clean_up(self) -> None:
        """Every task ended, the client closed (a graceful disconnect), the child terminated if it
        still runs, its stdin and output closed, the host's signals given back."""
        tasks, background = list(self._watched), list(self._background)
        for task in [*tasks, *background]:
            task.cancel()
        results = await asyncio.gather(*tasks, *background, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError | FollowerError):
                logger.opt(exception=result).error("follow: internal task failed")
        await self._client.close()
        if not self._child.exited:
            await self._child.terminate()
        self._writer.close()
        self._capture.stop_reading()
        self._signals.remove()

    def _watch(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """A task of the run itself (ended by :meth:`_clean_up`)."""
        task = asyncio.create_task(coro, name=name)
        self._watched.append(task)
        return task

    def _in_background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- the owner's deliveries, typed into the child ------------------------------------------------

    async def type_delivery(self, delivery: Delivery) -> None:
        """An owner's message (its files saved in the inbox first): its lines on the child's stdin."""
        if self._writer.gone:
            raise DeliveryDeclined("the child's stdin is closed")
        client, inbox, context = self._client, self._inbox, self._settings.context
        text: str | None
        if delivery.transcribed_from is not None:  # a voice note the leader transcribed: its text
            saved = await save_transcribed(client, delivery, inbox) if context else None
            text = transcript_text(delivery, saved, context=context)
        elif delivery.files is not None:  # voice, audio, video, an album: a line per file
            text = delivery_text(delivery, saved_files=await save_files(client, delivery, inbox))
        else:
            saved = await save_document(client, delivery, inbox) if delivery.document else None
            text = delivery_text(delivery, saved)
        if text is None:
            logger.info("follow: delivery {} carries no text; nothing written", delivery.delivery_id)
            return
        replied = context_line(delivery) if context else None
        await self._type(f"{replied}\n{text}" if replied else text)

    async def type_edit(self, edit: Edit) -> None:
        """An owner's edit of an earlier message (only with --context: the client asks for edits then)."""
        if self._writer.gone:
            raise DeliveryDeclined("the child's stdin is closed")
        await self._type(edit_text(edit))

    async def type_button_press(self, press: ButtonPress) -> None:
        logger.info("follow: button pressed; typing its answer")
        await self._type(press.data)

    async def apply_control(self, control: Control) -> None:
        """``/interrupt``, ``/kill``, ``/eof`` and (with --pty) ``/screen``."""
        child = self._child
        logger.info("follow: control {} from the topic", control.action)
        if control.action == "interrupt":
            child.interrupt()
        elif control.action == "kill":
            self._in_background(child.terminate(), "follow-kill")
        elif control.action == "eof":
            child.eof(self._writer)
        elif control.action == "screen" and self._renderer is not None:
            if self._poster.drawing_screenshot:  # the picture being drawn is of this moment too
                logger.info("follow: a screenshot is being drawn already; not drawing another")
            else:
                self._in_background(self._poster.post_screenshot(), "follow-screenshot")

    async def _type(self, text: str) -> None:
        """Write ``text`` to the child's stdin; what cannot be written declines the delivery."""
        writer = self._writer
        if writer.gone:
            raise DeliveryDeclined("the child's stdin is closed")
        if self._stalled.is_set():
            raise DeliveryDeclined("earlier input is still waiting for the child")
        data = delivery_input(text, end_blocks=self._settings.end_blocks)
        try:
            await writer.write(data, self._settings.stdin_timeout_s)
        except StdinClosed as exc:
            raise DeliveryDeclined(str(exc)) from None
        except StdinStalled as exc:
            self._stalled.set()
            self._in_background(self._recover_from_stall(), "follow-stdin-stall")
            raise DeliveryDeclined(str(exc)) from None
        if self._child.echoes_input():
            self._capture.expect_echo(data.decode("utf-8", "replace"))

    async def _recover_from_stall(self) -> None:
        await self._writer.wait_writable()
        self._stalled.clear()
        if not self._writer.gone:
            logger.info("follow: the child reads its stdin again; asking the leader for what was left")
            self._client.redeliver()


class HostSignals:
    """The host's signals while follow runs: the first SIGINT goes to the child, a second within
    :data:`DOUBLE_INTERRUPT_S` (or SIGTERM, SIGHUP) stops the child; after the child exited, any of
    them abandons the hand-off (:attr:`aborted`)."""

    def __init__(self, child: Child, in_background: Callable[[Coroutine[Any, Any, None], str], None]):
        self._child = child
        self._in_background = in_background
        self._loop = asyncio.get_running_loop()
        self.aborted = asyncio.Event()
        self._last_interrupt: float | None = None
        self._installed: list[int] = []

    def install(self) -> None:
        for signum, handler in ((signal.SIGTERM, self._on_sigterm), (signal.SIGHUP, self._on_sigterm),
                                (signal.SIGINT, self._on_sigint)):
            try:
                self._loop.add_signal_handler(signum, handler)
                self._installed.append(signum)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    def remove(self) -> None:
        for signum in self._installed:
            self._loop.remove_signal_handler(signum)
        self._installed = []

    def _on_sigint(self) -> None:
        now = self._loop.time()
        child = self._child
        if child.exited:
            logger.warning("follow: interrupted after the child exited; abandoning unsent output")
            self.aborted.set()
        elif self._last_interrupt is not None and now - self._last_interrupt <= DOUBLE_INTERRUPT_S:
            logger.info("follow: second Ctrl-C; stopping the child")
            self._in_background(child.terminate(), "follow-stop")
        else:
            self._last_interrupt = now
            logger.info("follow: Ctrl-C passed on to the child (again within {:g} s ends follow)",
                        DOUBLE_INTERRUPT_S)
            child.interrupt()

    def _on_sigterm(self) -> None:
        if self._child.exited:
            logger.warning("follow: signal after the child exited; abandoning unsent output")
            self.aborted.set()
        else:
            logger.info("follow: SIGTERM; stopping the child")
            self._in_background(self._child.terminate(), "follow-stop")
