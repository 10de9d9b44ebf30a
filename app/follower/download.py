"""Owner files fetched from the leader (``GET /v1/files/<fileId>``), for :class:`FollowerClient`
and ``topicbus follow`` alike: read in chunks until the end of the body, checked against the size
Telegram reported and the download limit, and written to a temporary file beside the destination
that is moved into place only when complete, never over another file.

A download that fails in any way raises :class:`FollowerDownloadError` and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import AsyncGenerator

import aiohttp

from topicbus.follower.model import FollowerDownloadError

__all__ = ["CHUNK_BYTES", "DOWNLOAD_LIMIT", "DOWNLOAD_STALL_S", "checked_chunks", "place", "write_new_file"]

DOWNLOAD_LIMIT = 20 * 1024 * 1024  # Telegram lets bots download files up to 20 MB (getFile)
DOWNLOAD_STALL_S = 60.0  # a file download that receives nothing for this long has failed
CHUNK_BYTES = 64 * 1024
MAX_SUFFIX = 10_000  # "<stem>-1<ext>" … before giving up on a directory full of one name
PARTIAL_PREFIX = ".partial-"  # a download in progress: hidden, removed when it fails
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def too_large(size: int, max_bytes: int) -> FollowerDownloadError:
    return FollowerDownloadError(f"the file is {size} bytes, over the download limit of {max_bytes}",
                                 too_large=True)


async def checked_chunks(resp: aiohttp.ClientResponse, *, size: int | None,
                         max_bytes: int = DOWNLOAD_LIMIT) -> AsyncGenerator[bytes, None]:
    """The body of a ``/v1/files`` answer, chunk by chunk until its end. Raises
    :class:`FollowerDownloadError` for a status other than 200, a body over ``max_bytes``
    (``too_large``), and, when ``size`` (Telegram's ``fileSize``) is known, a body that runs past it
    or ends before it. A transfer that breaks off raises aiohttp's error (the caller wraps it)."""
    if resp.status != 200:
        raise FollowerDownloadError(f"the leader answered HTTP {resp.status}", status=resp.status)
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise too_large(resp.content_length, max_bytes)
    received = 0
    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
        received += len(chunk)
        if received > max_bytes:
            raise too_large(received, max_bytes)
        if size is not None and received > size:
            raise FollowerDownloadError(f"the download ran past the {size} bytes Telegram reported")
        yield chunk
    if size is not None and received != size:
        raise FollowerDownloadError(f"the download ended after {received} of {size} bytes")


async def write_new_file(chunks: AsyncGenerator[bytes, None], path: str) -> str:
    """Write ``chunks`` to a temporary file in ``path``'s directory (made if missing), then
    :func:`place` it at ``path``; returns the path it was saved as. On any error, cancellation
    included, the temporary file is removed and the error propagates."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    partial = os.path.join(directory, PARTIAL_PREFIX + secrets.token_hex(8))
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # umask applies
    try:
        with os.fdopen(fd, "wb") as fh:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    fh.write(chunk)
        return place(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        raise


def place(partial: str, path: str) -> str:
    """Give the complete file ``partial`` the name ``path``, or, when that name is taken, the first
    free one of ``<stem>-1<ext>``, ``<stem>-2<ext>``…; returns the name it got. Never replaces a
    file, also against another process saving at the same moment: a hard link fails on a name that
    exists (where the file system has no hard links, the name is first claimed by an exclusive
    create). ``partial`` is gone afterwards."""
    stem, ext = os.path.splitext(path)
    for n in range(MAX_SUFFIX):
        candidate = path if n == 0 else f"{stem}-{n}{ext}"
        try:
            os.link(partial, candidate)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            try:
                os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            except FileExistsError:
                continue
            os.replace(partial, candidate)  # over the empty file this call just created, nothing else
            return candidate
        os.unlink(partial)
        return candidate
    raise FileExistsError(errno.EEXIST, f"no free name like {os.path.basename(path)}", path)
