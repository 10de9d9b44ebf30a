"""Process liveness port (docs/operations.md, "Process liveness (proof of death)"): may the leader *prove* that a follower process is dead?

A follower reports ``pid``, ``processBirthId`` (``"<pid>:start:<ticks>"``, the start time in clock
ticks from ``/proc/<pid>/stat``) and ``hostId`` (machine id + boot id + pid namespace). The leader
answers :attr:`Liveness.DEAD` only when it shares that host id *and* ``/proc`` shows either no such
pid or a different process under it (start ticks differ: the pid was reused). Everything it cannot
verify — another host or container, another pid namespace, a reboot, no ``/proc``, permission
problems, malformed input — is :attr:`Liveness.UNKNOWN`, never dead.

Running in Docker: leader and followers must see the same pid namespace (run them in one container,
or give the leader ``pid: host`` when followers run on the host). Otherwise every probe is UNKNOWN
and a silent follower's topic is preserved/pruned from routing but never deleted on liveness grounds.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import uuid

from topicbus.core.liveness import Liveness, LivenessPort

__all__ = [
    "Liveness",
    "LivenessPort",
    "ProcessLiveness",
    "current_host_id",
    "process_start_ticks",
    "process_birth_id",
    "parse_birth_id",
]

MACHINE_ID_PATHS = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PID_NS_LINK = "/proc/self/ns/pid"
#: Linux PID_MAX_LIMIT on 64-bit; a larger "pid" cannot be real.
PID_MAX_LIMIT = 4_194_304
_BIRTH_ID = re.compile(r"([1-9][0-9]*):start:([0-9]+)")
_STARTTIME_FIELD = 22  # 1-based, man 5 proc
_DEAD_STATES = frozenset({"Z", "X", "x"})  # zombie / dead: exited, only awaiting reaping


# --------------------------------------------------------------------------------------------
# Identity of this host / process
# --------------------------------------------------------------------------------------------


def _read_first(paths: tuple[str, ...]) -> str:
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


def _pid_namespace(link: str = PID_NS_LINK) -> str:
    try:
        return os.readlink(link)
    except OSError:
        return ""


def compute_host_id(machine_id: str, boot_id: str, pid_namespace: str) -> str:
    """sha256 (first 32 hex) over the three identity parts.

    When neither the boot id nor the pid namespace is readable (no ``/proc``), nothing ties this
    process to a host, so a random id is returned: it never equals another process's id, which
    keeps every probe against it UNKNOWN instead of risking a false match.
    """
    if not boot_id and not pid_namespace:
        return "unverifiable-" + uuid.uuid4().hex[:19]
    digest = hashlib.sha256("\n".join((machine_id, boot_id, pid_namespace)).encode("utf-8"))
    return digest.hexdigest()[:32]


@functools.cache
def current_host_id() -> str:
    """Stable id of this host, boot and pid namespace (cached for the life of the process)."""
    return compute_host_id(_read_first(MACHINE_ID_PATHS), _read_first((BOOT_ID_PATH,)), _pid_namespace())


class _StatUnreadable(Exception):
    """``/proc/<pid>/stat`` exists but could not be read or parsed."""


def _read_stat(pid: int, proc_root: str) -> tuple[str, int]:
    """Return (state, start ticks) from ``<proc_root>/<pid>/stat``.

    Raises ``FileNotFoundError``/``ProcessLookupError`` when the pid does not exist, and
    :class:`_StatUnreadable` for anything else.
    """
    path = os.path.join(proc_root, str(pid), "stat")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        raise
    except NotADirectoryError as exc:
        raise FileNotFoundError(errno.ENOENT, "no such process", path) from exc
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise ProcessLookupError(errno.ESRCH, "no such process", path) from exc
        raise _StatUnreadable(str(exc)) from exc
    text = raw.decode("ascii", errors="replace")
    # "pid (comm) state ppid ..." — comm may contain spaces and ")" — split after the LAST ")".
    head, sep, tail = text.rpartition(")")
    if not sep or "(" not in head:
        raise _StatUnreadable("malformed stat")
    fields = tail.split()
    index = _STARTTIME_FIELD - 3  # tail starts at field 3 (state)
    if len(fields) <= index:
        raise _StatUnreadable("truncated stat")
    try:
        ticks = int(fields[index])
    except ValueError as exc:
        raise _StatUnreadable("non-numeric starttime") from exc
    if ticks < 0:
        raise _StatUnreadable("negative starttime")
    return fields[0], ticks


def process_start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """Field 22 (starttime, clock ticks since boot) of ``/proc/<pid>/stat``; ``None`` if unavailable."""
    try:
        return _read_stat(int(pid), proc_root)[1]
    except (OSError, _StatUnreadable, ValueError):
        return None


def process_birth_id(pid: int | None = None) -> str:
    """``"<pid>:start:<ticks>"``; ``"<pid>:unverifiable:<random>"`` when ``/proc`` is unavailable."""
    if pid is None:
        pid = os.getpid()
    ticks = process_start_ticks(pid)
    if ticks is None:
        return f"{pid}:unverifiable:{uuid.uuid4().hex}"
    return f"{pid}:start:{ticks}"


def parse_birth_id(value: object) -> tuple[int, int] | None:
    """``(pid, ticks)`` for a well-formed ``"<pid>:start:<ticks>"``, else ``None``."""
    if not isinstance(value, str):
        return None
    match = _BIRTH_ID.fullmatch(value)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


# --------------------------------------------------------------------------------------------
# The port
# --------------------------------------------------------------------------------------------


def _safe_pid(pid: object) -> bool:
    return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX_LIMIT


class ProcessLiveness:
    """Linux ``/proc`` implementation of the liveness port.

    ``signal_check`` (default: on when ``proc_root`` is the real ``/proc``) confirms a missing
    ``/proc/<pid>`` with ``kill(pid, 0)`` before answering DEAD, so a ``hidepid`` mount that hides
    other users' processes cannot turn a live process into a "dead" one.
    """

    def __init__(self, host_id: str, proc_root: str = "/proc", *, signal_check: bool | None = None) -> None:
        self.host_id = host_id
        self.proc_root = proc_root
        self.signal_check = (os.path.realpath(proc_root) == "/proc") if signal_check is None else signal_check

    def probe(self, pid: int | None, process_birth_id: str | None, host_id: str | None) -> Liveness:
        try:
            return self._probe(pid, process_birth_id, host_id)
        except Exception:
            return Liveness.UNKNOWN

    def probe_record(self, record: object) -> Liveness:
        """Probe from an object with ``pid``, ``process_birth_id`` and ``host_id`` attributes."""
        return self.probe(
            getattr(record, "pid", None),
            getattr(record, "process_birth_id", None),
            getattr(record, "host_id", None),
        )

    def _probe(self, pid: object, birth_id: object, host_id: object) -> Liveness:
        if not _safe_pid(pid):
            return Liveness.UNKNOWN
        assert isinstance(pid, int)
        if not isinstance(host_id, str) or not isinstance(self.host_id, str):
            return Liveness.UNKNOWN
        if not host_id or host_id != self.host_id:
            return Liveness.UNKNOWN
        parsed = parse_birth_id(birth_id)
        if parsed is None or parsed[0] != pid:
            return Liveness.UNKNOWN
        expected_ticks = parsed[1]
        if not os.path.isdir(self.proc_root):
            return Liveness.UNKNOWN  # no /proc at all: nothing can be proven
        try:
            state, ticks = _read_stat(pid, self.proc_root)
        except (FileNotFoundError, ProcessLookupError):
            return self._confirm_absent(pid)
        except _StatUnreadable:
            return Liveness.UNKNOWN
        if ticks != expected_ticks:
            return Liveness.DEAD  # the pid now belongs to a different process
        if state in _DEAD_STATES:
            return Liveness.DEAD  # exited; only waiting to be reaped
        return Liveness.ALIVE

    def _confirm_absent(self, pid: int) -> Liveness:
        if not self.signal_check:
            return Liveness.DEAD
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return Liveness.DEAD
        except OSError:
            return Liveness.UNKNOWN  # exists but is not ours to see (EPERM) or other trouble
        return Liveness.UNKNOWN  # the kernel says it exists though /proc does not show it
