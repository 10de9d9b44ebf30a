"""``topicbus follow -- CMD ARGS…``: run a command as a child and attach it to the leader as one follower.

The parts, by role: :mod:`~topicbus.follower.child` (the child on pipes or a pty, its stdin, its
signals), :mod:`~topicbus.follower.inputs` (what a message types), :mod:`~topicbus.follower.output`
and :mod:`~topicbus.follower.terminal` (pipe-mode cleaning, pty rendering through pyte, batches,
yes/no prompts), :mod:`~topicbus.follower.capture` (reading and posting); this module runs them.

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
from collections.abc import Sequence

from loguru import logger

from topicbus.follower.capture import OutputCapture
from topicbus.follower.child import StdinClosed, StdinStalled, StdinWriter, spawn
from topicbus.follower.client import FollowerClient
from topicbus.follower.inputs import (INBOX_DIR, context_line, delivery_input, delivery_text, edit_text,
                                      save_document, save_files, save_transcribed, transcript_text)
from topicbus.follower.model import (
    ButtonPress,
    Control,
    Delivery,
    DeliveryDeclined,
    Edit,
    FollowerError,
    FollowerSendError,
    FollowerSuperseded,
    split_text,
)
from topicbus.follower.output import MAX_PENDING_BYTES, OutputBatcher, dropped_marker, yes_no_buttons
from topicbus.follower.screenshot import grab, render_png
from topicbus.follower.terminal import ScreenRenderer
from topicbus.protocol import (CAP_BUTTONS, CAP_FORMAT, CAP_PHOTO, CAP_SCREEN_FRAMES, CAP_TAIL, MAX_DOCUMENT_BYTES,
                               MAX_TEXT_CHARS, TextFormat)

__all__ = [
    "EXIT_REFUSED",
    "EXIT_SUPERSEDED",
    "MAX_PENDING_BYTES",
    "OutputBatcher",
    "delivery_text",
    "dropped_marker",
    "exit_code_of",
    "exit_notice",
    "run_follow",
    "split_text",
]

EXIT_SUPERSEDED = 75  # EX_TEMPFAIL: another follower took this workspace over
EXIT_REFUSED = 78  # EX_CONFIG: wrong secret or incompatible protocol
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
DOUBLE_INTERRUPT_S = 2.0  # a second host Ctrl-C within this ends follow
STDERR_MODES = ("topic", "merge", "inherit")
FORMATS = ("pre", "plain", "markdown")
#: The pty's size under --pty: wide enough that output lines are rarely wrapped, and a full screen
#: (160 × 25) still fits one 4,096-character message.
DEFAULT_PTY_SIZE = (160, 25)


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
    if not command:
        raise ValueError("follow needs a command to run")
    if stderr not in STDERR_MODES:
        raise ValueError(f"stderr must be one of {', '.join(STDERR_MODES)}")
    if text_format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    try:
        child = await spawn(command, cwd=cwd, stderr=stderr, pty=pty, size=pty_size)
    except FileNotFoundError:
        logger.error("follow: command not found: {}", command[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        logger.error("follow: command not executable: {}", command[0])
        return EXIT_NOT_EXECUTABLE
    logger.info("follow: started child pid {}{}", child.pid, " on a pty" if pty else "")

    writer = StdinWriter(child.stdin_fd, owns_fd=not pty)
    renderer = (ScreenRenderer(*pty_size, quiet_s=flush_interval_s, snapshot_interval_s=snapshot_interval_s)
                if pty else None)
    batcher = OutputBatcher(max_batch_chars=max_batch_chars, flush_interval_s=flush_interval_s,
                            max_delay_s=max_delay_s)
    capture = OutputCapture(child, batcher, renderer=renderer, quiet_s=flush_interval_s,
                            leader_reachable=lambda: client.registered,
                            # Before the leader answered, nothing is posted yet: a line being redrawn is
                            # held for a tail rather than posted as a partial that no tail could replace.
                            live_tails=lambda: CAP_TAIL in client.leader_capabilities or not client.registered)
    workdir = os.path.abspath(cwd) if cwd else os.getcwd()
    inbox = os.path.join(workdir, INBOX_DIR)
    background: set[asyncio.Task] = set()
    stalled = asyncio.Event()
    screenshot_busy = False  # a /screen picture is being drawn

    def in_background(coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        background.add(task)
        task.add_done_callback(background.discard)

    async def recover_from_stall() -> None:
        await writer.wait_writable()
        stalled.clear()
        if not writer.gone:
            logger.info("follow: the child reads its stdin again; asking the leader for what was left")
            client.redeliver()

    async def type_input(text: str) -> None:
        if writer.gone:
            raise DeliveryDeclined("the child's stdin is closed")
        if stalled.is_set():
            raise DeliveryDeclined("earlier input is still waiting for the child")
        data = delivery_input(text, end_blocks=end_blocks)
        try:
            await writer.write(data, stdin_timeout_s)
        except StdinClosed as exc:
            raise DeliveryDeclined(str(exc)) from None
        except StdinStalled as exc:
            stalled.set()
            in_background(recover_from_stall(), "follow-stdin-stall")
            raise DeliveryDeclined(str(exc)) from None
        if child.echoes_input():
            capture.expect_echo(data.decode("utf-8", "replace"))

    async def on_delivery(delivery: Delivery) -> None:
        if writer.gone:
            raise DeliveryDeclined("the child's stdin is closed")
        if delivery.transcribed_from is not None:  # a voice note the leader transcribed: its text
            saved = await save_transcribed(client, delivery, inbox) if context else None
            text: str | None = transcript_text(delivery, saved, context=context)
        elif delivery.files is not None:  # voice, audio, video, an album: a line per file
            text = delivery_text(delivery, saved_files=await save_files(client, delivery, inbox))
        else:
            saved = await save_document(client, delivery, inbox) if delivery.document else None
            text = delivery_text(delivery, saved)
        if text is None:
            logger.info("follow: delivery {} carries no text; nothing written", delivery.delivery_id)
            return
        replied = context_line(delivery) if context else None
        await type_input(f"{replied}\n{text}" if replied else text)

    async def on_edit(edit: Edit) -> None:  # only with --context: the client asks for edits then
        if writer.gone:
            raise DeliveryDeclined("the child's stdin is closed")
        await type_input(edit_text(edit))

    async def on_button(press: ButtonPress) -> None:
        logger.info("follow: button pressed; typing its answer")
        await type_input(press.data)

    async def on_control(control: Control) -> None:
        logger.info("follow: control {} from the topic", control.action)
        if control.action == "interrupt":
            child.interrupt()
        elif control.action == "kill":
            in_background(child.terminate(), "follow-kill")
        elif control.action == "eof":
            child.eof(writer)
        elif control.action == "screen" and renderer is not None:
            if screenshot_busy:  # the picture being drawn is of this moment too
                logger.info("follow: a screenshot is being drawn already; not drawing another")
            else:
                in_background(post_screenshot(renderer), "follow-screenshot")

    client = FollowerClient(
        leader_url=leader_url, secret=secret, on_delivery=on_delivery, on_control=on_control,
        on_button=on_button, on_edit=on_edit if context else None, media=True, screenshots=pty, cwd=workdir, session_id=session, name=name, pid=child.pid,
        heartbeat_interval_s=heartbeat_interval_s, ca_file=ca_file,
        # A reachable leader whose outbox for this agent is full is backpressure, never a reason to
        # drop output: a send waits until the outbox has room (the capture stops reading meanwhile).
        backlog_wait_s=math.inf,
    )

    async def send_text(text: str, fmt: TextFormat | None) -> None:
        if fmt is None:
            await client.send_text(text)
        else:
            await client.send_text(text, format=fmt)

    async def leader_answered() -> None:
        """Output printed before the first registration (a prompt at start) is shaped with what the
        leader accepts (monospace, Yes/No buttons, tails, frames), not as plain text: wait for its
        answer. A send would wait for the leader anyway; a terminal failure is raised by the send."""
        if not client.registered and client.failure is None:
            try:
                await client.wait_registered()
            except FollowerError:
                pass

    async def post(batch: str, last: bool) -> None:
        text = batch.strip("\n")
        if not text.strip():
            return
        await leader_answered()
        caps = client.leader_capabilities
        fmt = text_format if CAP_FORMAT in caps else None
        buttons = yes_no_buttons(text) if last and CAP_BUTTONS in caps else None
        try:
            if buttons is None:
                await send_text(text, fmt)
                return
            chunks = split_text(text)
            for chunk in chunks[:-1]:
                await send_text(chunk, fmt)
            message = {"type": "text", "text": chunks[-1], "buttons": buttons}
            if fmt is not None:
                message["format"] = fmt
            await client.send_message(message)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused a batch of output ({})", exc.code)

    async def post_screenshot(renderer: ScreenRenderer) -> None:
        """``/screen``: the screen as it is now (copied at once, drawn in a thread) as a photo."""
        nonlocal screenshot_busy
        screenshot_busy = True
        shot = grab(renderer.screen)
        try:
            data = await asyncio.to_thread(render_png, shot)
        except ImportError:  # a follower-only install without Pillow
            data = None
        finally:
            screenshot_busy = False
        try:
            if data is None:
                await send_text("🖥 /screen needs Pillow on the agent's machine (pip install Pillow).", None)
            elif len(data) > MAX_DOCUMENT_BYTES:
                await send_text(f"🖥 The screen's picture is {len(data) // 1024} KiB, more than the "
                                f"{MAX_DOCUMENT_BYTES // 1024} KiB the bus carries; try a smaller --pty-size.", None)
            elif CAP_PHOTO in client.leader_capabilities:
                await client.send_photo("screen.png", data)
            else:  # an older leader: the same picture as a file
                await client.send_document("screen.png", data)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused the screenshot ({})", exc.code)

    async def post_tail(state: str) -> None:
        """The current state of a line being redrawn: the live message's tail (tail-v1)."""
        await leader_answered()
        if CAP_TAIL not in client.leader_capabilities:
            return  # an older leader: the line is posted once it is finished, or the program pauses
        message: dict[str, object] = {"type": "text", "text": state, "tail": True}
        if CAP_FORMAT in client.leader_capabilities:
            message["format"] = text_format
        try:
            await client.send_message(message)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused a line's progress ({})", exc.code)

    async def post_frame(frame: str) -> None:
        """A full-screen program's newest frame: it replaces the topic's screen message (screen-frames-v1);
        a leader without it gets the frame as output, at most one every ``snapshot_interval_s``."""
        await leader_answered()
        caps = client.leader_capabilities
        if CAP_SCREEN_FRAMES not in caps:
            assert renderer is not None
            renderer.screen.session.interval_s = max(renderer.screen.session.interval_s, snapshot_interval_s)
            await post(frame, False)
            return
        message = {"type": "text", "text": frame[:MAX_TEXT_CHARS], "screen": True}
        if CAP_FORMAT in caps:
            message["format"] = "pre"  # a screen keeps its columns
        try:
            await client.send_message(message)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused a screen frame ({})", exc.code)

    async def hand_off(returncode: int) -> None:
        await poster
        notice = exit_notice(returncode, loop.time() - started_at)
        logger.info("follow: {}", notice)
        try:
            await send_text(notice, "plain" if CAP_FORMAT in client.leader_capabilities else None)
        except FollowerSendError as exc:
            logger.error("follow: the leader refused the exit notice ({})", exc.code)

    abort = asyncio.Event()
    last_interrupt: float | None = None

    def on_sigint() -> None:
        nonlocal last_interrupt
        now = loop.time()
        if child.exited:
            logger.warning("follow: interrupted after the child exited; abandoning unsent output")
            abort.set()
        elif last_interrupt is not None and now - last_interrupt <= DOUBLE_INTERRUPT_S:
            logger.info("follow: second Ctrl-C; stopping the child")
            in_background(child.terminate(), "follow-stop")
        else:
            last_interrupt = now
            logger.info("follow: Ctrl-C passed on to the child (again within {:g} s ends follow)",
                        DOUBLE_INTERRUPT_S)
            child.interrupt()

    def on_sigterm() -> None:
        if child.exited:
            logger.warning("follow: signal after the child exited; abandoning unsent output")
            abort.set()
        else:
            logger.info("follow: SIGTERM; stopping the child")
            in_background(child.terminate(), "follow-stop")

    installed: list[signal.Signals] = []
    for signum, handler in ((signal.SIGTERM, on_sigterm), (signal.SIGHUP, on_sigterm), (signal.SIGINT, on_sigint)):
        try:
            loop.add_signal_handler(signum, handler)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    poster = asyncio.create_task(capture.post_loop(post, post_tail, post_frame if pty else None),
                                 name="follow-poster")
    exited = asyncio.create_task(child.process.wait(), name="follow-child")
    failed = asyncio.create_task(client.wait_failure(), name="follow-failure")
    aborted = asyncio.create_task(abort.wait(), name="follow-abort")
    tasks: list[asyncio.Task] = [poster, exited, failed, aborted]
    try:
        await client.start()
        await asyncio.wait({exited, failed}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            error = failed.result()
            logger.error("follow: {}; terminating the child", error)
            await child.terminate()
            return _fatal_exit_code(error)
        returncode = exited.result()
        client.stop_receiving()
        writer.mark_gone()
        code = exit_code_of(returncode)
        logger.info("follow: child exited with {}; handing its output to the leader", code)
        await capture.drain_after_exit()
        capture.finish()
        handoff = asyncio.create_task(hand_off(returncode), name="follow-handoff")
        tasks.append(handoff)
        outcome = await _bounded_handoff(client, handoff, failed, aborted, handoff_timeout_s)
        if outcome is not None:
            return outcome
        return code
    finally:
        for task in [*tasks, *background]:
            task.cancel()
        results = await asyncio.gather(*tasks, *background, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError | FollowerError):
                logger.opt(exception=result).error("follow: internal task failed")
        await client.close()
        if not child.exited:
            await child.terminate()
        writer.close()
        capture.stop_reading()
        for signum in installed:
            loop.remove_signal_handler(signum)


async def _bounded_handoff(client: FollowerClient, handoff: asyncio.Task, failed: asyncio.Task,
                           aborted: asyncio.Task, limit_s: float) -> int | None:
    """Wait for the hand-off; None when it completed or was abandoned, else the exit code to use.
    The wait is bounded only while the leader is unreachable (``limit_s`` in total)."""
    loop = asyncio.get_running_loop()
    unreachable = 0.0
    step = 0.25
    while True:
        before = loop.time()
        registered = client.registered
        done, _ = await asyncio.wait({handoff, failed, aborted}, timeout=step, return_when=asyncio.FIRST_COMPLETED)
        if not registered and not client.registered:
            unreachable += loop.time() - before
        if handoff in done:
            error = handoff.exception()
            if isinstance(error, FollowerError) and client.failure is not None:
                return _fatal_exit_code(client.failure)
            if error is not None:
                logger.opt(exception=error).error("follow: handing the output over failed")
            return None
        if failed in done and not failed.cancelled() and failed.exception() is None:
            logger.error("follow: {}; output still pending was not posted", failed.result())
            return _fatal_exit_code(failed.result())
        if aborted in done:
            logger.warning("follow: output not handed over (abandoned)")
            return None
        if unreachable >= limit_s:
            logger.warning("follow: the leader was unreachable for {:g} s; output not handed over", unreachable)
            return None


def _fatal_exit_code(error: BaseException) -> int:
    return EXIT_SUPERSEDED if isinstance(error, FollowerSuperseded) else EXIT_REFUSED
