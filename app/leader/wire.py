"""The wire: a term's one Telegram call in flight at a time, and the calls waiting for it.

Every call of the term waits here with its priority and topic: :meth:`TelegramWire.call` for the use
cases' calls (through :class:`~topicbus.leader.outbound.ScheduledGateway`), :meth:`TelegramWire.output_call`
for the calls of an output step (``leader/output_sender``). The outbound scheduler (``leader/outbound``)
decides which waiting call goes next, once the chat's budget allows it, and hands it to
:meth:`TelegramWire.send`. The wire counts each call against the budget when its answer came (so the
count never runs ahead of Telegram's), and a ``RetryAfter`` pauses the chat before any other call goes.

The dependencies point one way: the scheduler drives the wire and the output sender, the sender puts
its calls on the wire, and the wire calls neither. It only rings the scheduler's bell (an
``asyncio.Event`` it is given) when a call arrives or ends.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from topicbus.core.budget import ChatBudget, Priority
from topicbus.core.target import Target
from topicbus.core.telegram import CallOutcome, CallResult

CALL_DEADLINE_S = 60.0
STOPPING = "leader stopping"


@dataclass
class WireCall:
    priority: Priority
    key: Target
    spends: bool
    fn: Callable[[], Awaitable[CallResult]]
    future: asyncio.Future[CallResult]
    deadline: float
    seq: int
    output: bool = False  # a call of an output step: tried once, its outcome settled by the step


class TelegramWire:
    def __init__(self, budget: ChatBudget, bell: asyncio.Event, call_waiting: asyncio.Event):
        self._budget = budget
        self._bell = bell  # the scheduler plans again when it rings
        self._call_waiting = call_waiting  # a call arrived: it ends the scheduler's output debounce
        self.waiting: deque[WireCall] = deque()
        self._calling: asyncio.Task[None] | None = None  # the one Telegram call on the wire
        self._seq = itertools.count()
        self._closed = False
        self.answered = False  # a call ended since the scheduler last planned (it clears this)

    @property
    def busy(self) -> bool:
        """A call is on the wire (the next one waits until it ended)."""
        return self._calling is not None

    async def call(self, priority: Priority, target: Target,
                   fn: Callable[[], Awaitable[CallResult]], *, spends: bool = True,
                   deadline_s: float = CALL_DEADLINE_S) -> CallResult:
        """Run one Bot API call when the budget allows it. ``RetryAfter`` is retried (the call did not
        happen) until ``deadline_s``; a BACKGROUND call is skipped while the budget is under pressure."""
        if self._closed:
            return CallResult(CallOutcome.AMBIGUOUS, STOPPING)
        future: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self.waiting.append(WireCall(priority, target, spends, fn, future,
                                     time.monotonic() + deadline_s, next(self._seq)))
        self._bell.set()
        self._call_waiting.set()
        return await future

    async def output_call(self, priority: Priority, key: Target, spends: bool,
                          fn: Callable[[], Awaitable[CallResult]]) -> CallResult:
        """A call of an output step, on the wire in its turn; its outcome goes back to the step."""
        if self._closed:
            return CallResult(CallOutcome.AMBIGUOUS, STOPPING)
        future: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self.waiting.append(WireCall(priority, key, spends, fn, future, float("inf"), next(self._seq), output=True))
        self._bell.set()
        return await future

    def skip(self, call: WireCall, result: CallResult) -> None:
        """A waiting call that will not go: it is answered with ``result`` now."""
        self.waiting.remove(call)
        call.future.set_result(result)

    def send(self, call: WireCall) -> None:
        """Put a waiting call on the wire (the scheduler chose it; nothing else is on the wire)."""
        self.waiting.remove(call)
        self._calling = asyncio.create_task(self._execute_call(call), name="outbound-call")

    async def _execute_call(self, call: WireCall) -> None:
        try:
            result = await call.fn()
        except asyncio.CancelledError:
            if not call.future.done():
                call.future.set_result(CallResult(CallOutcome.AMBIGUOUS, STOPPING))
            raise
        except Exception as exc:  # noqa: BLE001 - a gateway never raises; this is a bug guard
            result = CallResult(CallOutcome.AMBIGUOUS, type(exc).__name__)
        finally:
            self._budget.record(time.monotonic(), spends=call.spends, priority=call.priority)
            self._calling = None
            self.answered = True
            self._bell.set()
        if result.outcome is CallOutcome.RETRY_AFTER:
            self._budget.pause(time.monotonic(), result.retry_after_s)  # before any other call goes
            if not call.output and time.monotonic() + result.retry_after_s < call.deadline:
                self.waiting.appendleft(call)
                return
        if not call.future.done():
            call.future.set_result(result)

    async def close(self) -> None:
        """The term ends: the call on the wire is cancelled, every waiting call (and every later one)
        is answered as ambiguous at once."""
        self._closed = True
        if self._calling is not None:
            self._calling.cancel()
            await asyncio.gather(self._calling, return_exceptions=True)
            self._calling = None
        while self.waiting:
            call = self.waiting.popleft()
            if not call.future.done():
                call.future.set_result(CallResult(CallOutcome.AMBIGUOUS, STOPPING))
