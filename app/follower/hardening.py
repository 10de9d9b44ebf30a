"""What keeps the bus secret with `topicbus follow`, away from its child and the child's user.

The child of ``follow`` (the agent) usually runs as the same user as ``follow``. Without more, it
could read the secret where ``follow`` keeps it: ``/proc/<follow's pid>/environ`` (the environment
``follow`` was started with), ``/proc/<pid>/mem`` or a debugger attached to ``follow``.

* :func:`make_undumpable` — ``prctl(PR_SET_DUMPABLE, 0)``: the kernel then lets only root (strictly,
  ``CAP_SYS_PTRACE``) read ``follow``'s environment and memory or attach to it, and ``follow``
  writes no core dump. A child's program gets its own dumpable state again when it is executed, so
  the agent itself is unaffected. Linux only; elsewhere nothing happens.
* :func:`forget_secret_environment` — the secrets leave ``follow``'s own ``os.environ`` once read,
  so nothing ``follow`` starts later can inherit them (:func:`is_secret_name` also keeps them out of
  the child's environment, :func:`topicbus.follower.child.child_environment`).
* :data:`prctl` — libc's ``prctl`` (None when there is none), also used by
  :mod:`topicbus.follower.child` for ``PR_SET_PDEATHSIG``.

What this does not protect against: root, a secret file the agent's user can read (use
``--secret-fd``), and what the agent does through the bus under its own workspace.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable, MutableMapping

__all__ = ["forget_secret_environment", "is_secret_name", "make_undumpable", "prctl"]

PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
#: Environment variables a child never inherits and ``follow`` forgets once read: the bus secret and
#: the bot token (and any other TOPICBUS_* secret or token) would let the agent's code impersonate
#: any workspace on the bus.
_SECRET_NAME = re.compile(r"^TOPICBUS_.*(SECRET|TOKEN)", re.IGNORECASE)

prctl: Callable[..., int] | None
try:  # looked up once, at import: a forked child before exec only calls it
    prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    prctl = None


def is_secret_name(name: str) -> bool:
    """Whether the environment variable ``name`` holds a topicbus secret or token."""
    return _SECRET_NAME.match(name) is not None


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` for this process (see the module docstring); False when the
    system has no such call or refused it."""
    if prctl is None:  # pragma: no cover - not Linux
        return False
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 and prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0


def forget_secret_environment(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove every secret variable from ``environ`` (this process's environment by default);
    returns their names."""
    target = os.environ if environ is None else environ
    names = [name for name in target if is_secret_name(name)]
    for name in names:
        del target[name]
    return names
