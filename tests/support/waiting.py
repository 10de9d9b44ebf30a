"""The one poll-until helper: wait for a condition with a deadline, never for a fixed time.

Every wait in the suite goes through :func:`wait_until` (``FakeBotApi.wait_for`` and
``Cluster.wait_for`` are thin wrappers that add a summary of their state to the failure).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


async def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.01,
                     message: str | Callable[[], str] = "condition",
                     describe: Callable[[], str] | None = None) -> Any:
    """Re-check ``predicate`` every ``interval`` seconds until it returns something truthy; return it.

    ``predicate`` may be a plain function or return an awaitable (an ``async def`` or a lambda
    that returns a coroutine); it is awaited on each check. Exceptions it raises propagate.

    After ``timeout`` seconds it raises ``AssertionError`` naming ``message`` (a string, or a
    callable evaluated only on failure so it can show the state at that moment), the last value
    the predicate returned when that is informative, and ``describe()`` when given.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(_failure(timeout, message, value, describe))
        await asyncio.sleep(min(interval, remaining))


def _failure(timeout: float, message: str | Callable[[], str], last: Any,
             describe: Callable[[], str] | None) -> str:
    what = message() if callable(message) else message
    text = f"timed out after {timeout:g}s waiting for {what}"
    if last is not None and last is not False:
        shown = repr(last)
        text += f" (last value: {shown if len(shown) <= 200 else shown[:197] + '...'})"
    if describe is not None:
        text += f"\n{describe()}"
    return text
