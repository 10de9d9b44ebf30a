"""The bus ports, one each way between the leader and the bus transport (``bus/``).

:class:`FollowerConnection` is what the transport offers the leader for one follower socket;
:class:`LeaderBus` is what the transport needs from the leader, one method per request kind
(implemented by ``leader/followers.FollowerDesk``).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from topicbus.ports.telegram import FileDownload
from topicbus.core.records import Deliver, HeartbeatResult, RegistrationResult, SendResult, Superseded
from topicbus.protocol import FollowerRequest, Registration, SendRequest


class FollowerConnection(Protocol):
    """What the bus transport offers the domain for one follower socket.

    ``send_frame`` queues a frame (a delivery or a supersession; the transport encodes it) and returns at once (it raises when the connection is gone or
    cannot take more); ``congested`` says the queue should not be filled further until
    ``writable()`` returns (it raises when the connection is dropped meanwhile)."""

    @property
    def closed(self) -> bool: ...

    @property
    def congested(self) -> bool: ...

    async def writable(self) -> None: ...

    async def send_frame(self, frame: Deliver | Superseded) -> None: ...

    async def close(self, code: int = 1000, message: str = "") -> None: ...


class LeaderBus(Protocol):
    """What the bus needs from the leader: one method per request kind."""

    leader_build: str

    def follower_count(self) -> int: ...

    async def register(self, req: Registration, connection: FollowerConnection) -> RegistrationResult: ...

    async def heartbeat(self, req: FollowerRequest) -> HeartbeatResult: ...

    async def disconnect(self, req: FollowerRequest) -> None: ...

    async def send(self, req: SendRequest) -> SendResult: ...

    async def receipt(self, connection: FollowerConnection, delivery_id: str) -> None: ...

    def connection_closed(self, connection: FollowerConnection) -> None: ...

    def open_document(self, file_id: str) -> AbstractAsyncContextManager[FileDownload | None]:
        """A routed document's bytes, streamed while the block runs; None when it is not served."""
        ...
