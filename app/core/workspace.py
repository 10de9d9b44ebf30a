"""Workspace identity: which durable binding (and so which topic) a follower belongs to.

A follower's workspace identity is (host id, normalised cwd, session), where the session is
``--session``, else ``--name``, else empty. Same identity → same binding key → same topic, in every
process and across restarts. Pure code: the only ambient input is the process cwd used to resolve a
relative path, and that is a parameter.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from dataclasses import dataclass

from topicbus.core.display import clip_title, tokenize_segment

BINDING_KEY_PREFIX = "ws-"
"""Prefix of every workspace binding key."""

EPHEMERAL_SESSION_PREFIX = "instance:"
"""Session prefix given to followers with no cwd, name or session: such a follower gets a binding
of its own, keyed by its instance id."""

_WHITESPACE = re.compile(r"\s+")
_LEADING_SLASHES = re.compile(r"^/+")


def normalize_workspace_path(cwd: str, base: str | None = None) -> str:
    """Normalise a working directory to an absolute POSIX path without resolving symlinks.

    Surrounding whitespace is trimmed; an empty path raises ``ValueError``. A relative path is
    resolved against ``base`` (default: the process cwd). ``.``/``..`` and repeated slashes are
    collapsed and trailing slashes dropped (the root stays ``/``).
    """
    if not isinstance(cwd, str):
        raise ValueError("workspace path must be a string")
    path = cwd.strip()
    if not path:
        raise ValueError("workspace path is empty")
    if "\0" in path:
        raise ValueError("workspace path contains a NUL character")
    if not path.startswith("/"):
        root = os.getcwd() if base is None else base
        if not root.startswith("/"):
            raise ValueError("base directory for a relative workspace path must be absolute")
        path = posixpath.join(root, path)
    normalised = posixpath.normpath(path)
    # normpath keeps a leading "//" (POSIX leaves it implementation-defined); fold it.
    normalised = _LEADING_SLASHES.sub("/", normalised)
    return normalised.rstrip("/") or "/"


def _clean(value: str | None) -> str:
    """Trimmed text, ``""`` for ``None`` or blank."""
    return value.strip() if isinstance(value, str) else ""


@dataclass(frozen=True)
class WorkspaceIdentity:
    """(host, directory, session) — what makes two registrations "the same workspace".

    ``cwd`` is a normalised absolute path or ``""`` for a follower without a directory; ``session``
    is ``""`` when the follower gave neither a session nor a name.
    """

    host_id: str
    cwd: str
    session: str = ""

    def __post_init__(self) -> None:
        for field_name in ("host_id", "cwd", "session"):
            if "\0" in getattr(self, field_name):
                raise ValueError(f"workspace {field_name} contains a NUL character")
        if not self.host_id:
            raise ValueError("workspace host id is empty")

    @classmethod
    def for_follower(
        cls,
        host_id: str,
        cwd: str | None,
        session: str | None,
        name: str | None,
        instance_id: str,
    ) -> WorkspaceIdentity:
        """Identity of a registering follower.

        The session is ``session``, else ``name``, else empty; a follower with neither cwd, name nor
        session gets ``instance:<instance_id>`` so that it has a binding of its own. A blank cwd
        counts as none; a given cwd must be absolute (a relative path means nothing on the leader)
        and is normalised.
        """
        raw_cwd = _clean(cwd)
        if raw_cwd and not raw_cwd.startswith("/"):
            raise ValueError("follower cwd must be an absolute path")
        normalised = normalize_workspace_path(raw_cwd) if raw_cwd else ""
        chosen = _clean(session) or _clean(name)
        if not normalised and not chosen:
            instance = _clean(instance_id)
            if not instance:
                raise ValueError("follower instance id is empty")
            chosen = f"{EPHEMERAL_SESSION_PREFIX}{instance}"
        return cls(host_id=_clean(host_id), cwd=normalised, session=chosen)

    @property
    def binding_key(self) -> str:
        """Stable key of the workspace binding: ``ws-`` + 24 hex digits of a SHA-256 digest."""
        material = "\0".join((self.host_id, self.cwd, self.session)).encode("utf-8")
        return BINDING_KEY_PREFIX + hashlib.sha256(material).hexdigest()[:24]

    @property
    def is_ephemeral(self) -> bool:
        """True for the per-instance identity of a follower that gave no cwd, name or session."""
        return not self.cwd and self.session.startswith(EPHEMERAL_SESSION_PREFIX)

    @property
    def workspace_label(self) -> str:
        """Readable form for status output: ``cwd``, ``cwd#session`` or just the session."""
        if self.cwd and self.session:
            return f"{self.cwd}#{self.session}"
        return self.cwd or self.session or "(no workspace)"


def _words(text: str) -> set[str]:
    return {token.casefold() for token in tokenize_segment(text)}


def _join_without_repeats(leaf: str, session: str) -> str:
    """``leaf · session`` without saying a word twice (``--name pyu`` in ``pyu`` is just ``pyu``).

    When one part's words all appear in the other, that other part alone is the name; otherwise
    the session's words already in the directory name are left out (``api-server · worker`` for
    ``--name "api worker"``)."""
    leaf_words, session_words = _words(leaf), _words(session)
    if session_words and session_words <= leaf_words:
        return leaf
    if leaf_words and leaf_words <= session_words:
        return session
    kept = [word for word in session.split(" ") if not (_words(word) and _words(word) <= leaf_words)]
    return f"{leaf} · {' '.join(kept)}" if kept else leaf


def default_thread_name(identity: WorkspaceIdentity, slot: str | None) -> str:
    """Stable generated topic name for a new binding (never empty, at most 128 characters).

    The last segment of the cwd (``/`` for the root), plus `` · session`` when there is a session
    too (without repeating a word the directory already says); the session alone without a cwd;
    ``Agent <slot>`` for an ephemeral identity or when nothing readable is left.
    """
    session = "" if identity.is_ephemeral else _WHITESPACE.sub(" ", identity.session).strip()
    leaf = ""
    if identity.cwd:
        leaf = posixpath.basename(identity.cwd.rstrip("/")) or "/"
        leaf = _WHITESPACE.sub(" ", leaf).strip()
    if leaf and session:
        name = _join_without_repeats(leaf, session)
    else:
        name = leaf or session
    name = (clip_title(name) or "").rstrip()
    if name:
        return name
    return f"Agent {slot}" if slot else "Agent"
