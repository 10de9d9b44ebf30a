"""The leader as the bus sees it: one method per follower request kind.

The bus server decodes frames and calls :class:`FollowerDesk`; the desk hands each request to its
use case (registration, departure, routing, output intake) and turns domain refusals into protocol
errors.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from topicbus import __version__
from topicbus.core.records import HeartbeatResult, RegistrationResult, SendResult
from topicbus.logsetup import EventJournal
from topicbus.ports.telegram import FileDownload
from topicbus.ports.bus import FollowerConnection
from topicbus.leader.departure import CleanupUnconfirmed, Departures
from topicbus.leader.output_intake import OutputIntake
from topicbus.leader.registration import Registrations
from topicbus.leader.roster import Roster
from topicbus.leader.routing import Router
from topicbus.protocol import ErrorCode, FollowerRequest, ProtocolError, Registration, SendRequest
from topicbus.core.admission import AdmissionBlocked
from topicbus.core.authority import AuthorityLost

LEADER_BUILD = f"topicbus/{__version__}"


class FollowerDesk:
    leader_build = LEADER_BUILD

    def __init__(self, *, roster: Roster, registrations: Registrations, departures: Departures,
                 router: Router, intake: OutputIntake, events: EventJournal):
        self._events = events
        self._roster = roster
        self._registrations = registrations
        self._departures = departures
        self._router = router
        self._intake = intake

    def follower_count(self) -> int:
        return len(self._roster)

    async def register(self, req: Registration, connection: FollowerConnection) -> RegistrationResult:
        return await self._registrations.register(req, connection)

    async def heartbeat(self, req: FollowerRequest) -> HeartbeatResult:
        return await self._registrations.heartbeat(req)

    async def disconnect(self, req: FollowerRequest) -> None:
        entry = self._registrations.registered(req)
        self._intake.stream_ends(entry)
        try:
            await self._departures.disconnect(entry, lambda: self._registrations.registered(req))
        except CleanupUnconfirmed as exc:
            self._events.record(exc, phase="follower-disconnect", level="WARNING", instanceId=entry.instance_id)
            raise ProtocolError(ErrorCode.TELEGRAM_ERROR, str(exc)) from None
        except AdmissionBlocked as exc:
            raise ProtocolError(ErrorCode.BLOCKED_BY_RETIREMENT, str(exc)) from None
        except AuthorityLost:
            raise ProtocolError(ErrorCode.NOT_LEADER, "This process is not the leader (lease lost).") from None

    async def send(self, req: SendRequest) -> SendResult:
        return await self._intake.accept_output(self._registrations.registered(req), req)

    async def receipt(self, connection: FollowerConnection, delivery_id: str) -> None:
        await self._router.receipt(connection, delivery_id)

    def connection_closed(self, connection: FollowerConnection) -> None:
        self._roster.connection_closed(connection)

    def open_document(self, file_id: str) -> AbstractAsyncContextManager[FileDownload | None]:
        return self._router.open_document(file_id)
