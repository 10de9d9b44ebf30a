"""The bus server's connection guard with real sockets: caps, eviction, accept errors.

(The end-to-end versions, with a leader under ``ulimit -n 1024``, are in
tests/e2e/test_connection_hygiene.py; `make chaos` repeats them at full size.)
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap

import aiohttp

from topicbus.bus.guard import ACCEPT_ERROR_MESSAGE, ConnectionGuard, Throttle
from topicbus.bus.server import BusLimits, BusServer
from topicbus.core.status import StatusReport

SECRET = "guard-secret-value"


async def _status() -> StatusReport:
    return StatusReport(role="leader", epoch=1)


def _server(**limits) -> BusServer:
    return BusServer(host="127.0.0.1", port=0, secret=SECRET, status=_status, metrics=lambda: {},
                     limits=BusLimits(**limits))


async def test_idle_connections_beyond_the_unauthenticated_cap_make_room_for_new_ones():
    server = _server(max_unauthenticated=8, max_connections=16, head_timeout_s=30, idle_grace_s=0)
    await server.start()
    port = server.bound_port
    idle = []
    try:
        for _ in range(40):
            idle.append(await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port)))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/v1/status",
                                headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                assert resp.status == 200
        assert server.guard.unauthenticated <= 8
        assert server.guard.open_connections <= 16
    finally:
        for sock in idle:
            sock.close()
        await server.stop()


async def test_only_idle_connections_are_pushed_out_and_only_after_their_grace():
    """The guard on its own listening socket, accepting by hand: nothing reads the sockets, so what
    a client sent stays waiting, exactly as in the instant a burst of new connections arrives."""
    now = [100.0]
    guard = ConnectionGuard(max_connections=100, max_unauthenticated=3, head_timeout_s=30, idle_grace_s=1.0,
                            clock=lambda: now[0])
    [listener] = guard.listeners("127.0.0.1", 0)
    listener.listen(16)
    port = listener.getsockname()[1]
    clients: list[socket.socket] = []
    accepted: list[socket.socket] = []

    def arrive(sends: bytes = b"") -> socket.socket:
        client = socket.create_connection(("127.0.0.1", port))
        clients.append(client)
        if sends:
            client.sendall(sends)
        try:
            accepted.append(listener.accept()[0])
        except ConnectionAbortedError:
            pass  # refused by the guard
        return client

    try:
        talking = arrive(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        silent = arrive()
        arrive()
        young = arrive()  # all three are younger than the grace: refused
        assert guard.refused == 1 and guard.dropped_idle == 0 and _closed_by_peer(young)

        now[0] += 2  # the grace is over
        arrive()  # the oldest *idle* one makes room: not `talking`, whose request waits to be read
        assert guard.dropped_idle == 1 and _closed_by_peer(silent)
        talking.setblocking(False)
        try:
            assert talking.recv(1) != b""
        except BlockingIOError:
            pass  # still open: nothing to read, which is what a kept connection shows
        assert guard.unauthenticated == 3
    finally:
        for sock in accepted + clients:
            sock.close()
        listener.close()
    assert guard.open_connections == 0


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


async def test_authenticated_connections_are_never_evicted_and_the_total_cap_refuses_beyond_them():
    server = _server(max_unauthenticated=2, max_connections=4, head_timeout_s=30, idle_grace_s=0)
    await server.start()
    url = f"http://127.0.0.1:{server.bound_port}"
    try:
        sessions = [aiohttp.ClientSession() for _ in range(4)]
        try:
            for http in sessions:  # four keep-alive connections that proved the secret
                async with http.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                    assert resp.status == 200
            assert server.guard.open_connections == 4 and server.guard.unauthenticated == 0
            refused_before = server.guard.refused
            sock = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", server.bound_port))
            try:
                sock.settimeout(5)
                try:
                    data = await asyncio.to_thread(sock.recv, 1)
                except ConnectionResetError:
                    data = b""
                assert data == b""  # refused: closed at once
            finally:
                sock.close()
            assert server.guard.refused == refused_before + 1
            for http in sessions:  # and the authenticated ones still work
                async with http.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                    assert resp.status == 200
        finally:
            for http in sessions:
                await http.close()
    finally:
        await server.stop()


def test_accept_error_reports_are_throttled():
    lines: list[str] = []
    clock = [0.0]
    throttle = Throttle(interval_s=60, clock=lambda: clock[0])
    guard = ConnectionGuard(max_connections=10, max_unauthenticated=5, head_timeout_s=1, throttle=throttle)
    loop = asyncio.new_event_loop()
    try:
        from loguru import logger

        sink = logger.add(lines.append, format="{message}", level="WARNING")
        try:
            guard.install_accept_error_handler(loop)
            for _ in range(500):
                loop.call_exception_handler({"message": ACCEPT_ERROR_MESSAGE,
                                             "exception": OSError(24, "Too many open files")})
            clock[0] = 61
            loop.call_exception_handler({"message": ACCEPT_ERROR_MESSAGE,
                                         "exception": OSError(24, "Too many open files")})
        finally:
            logger.remove(sink)
    finally:
        loop.close()
    assert len(lines) == 2, lines
    assert "Too many open files" in lines[0] and "499 more since the last report" in lines[1]


# A bus server in its own process whose descriptors the script itself nearly exhausts, so that
# accept() fails with EMFILE; it prints what it logged once the parent says stop.
EMFILE_SCRIPT = textwrap.dedent("""
    import asyncio, os, resource, sys
    from loguru import logger
    from topicbus.bus.server import BusLimits, BusServer

    from topicbus.core.status import StatusReport

    async def status():
        return StatusReport(role="leader", epoch=1)

    async def main():
        logger.remove()
        logger.add(sys.stderr, format="{message}", level="INFO")
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        server = BusServer(host="127.0.0.1", port=0, secret="s", status=status, metrics=lambda: {},
                           limits=BusLimits(max_connections=5000, max_unauthenticated=5000, head_timeout_s=60))
        await server.start()
        hog = []
        try:
            while True:
                hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        for fd in hog[-2:]:  # leave the accepted connection nowhere to go
            os.close(fd)
        del hog[-2:]
        print(server.bound_port, flush=True)
        while server.guard.accept_errors < 3:  # asyncio retries accepting once a second
            await asyncio.sleep(0.05)
        for fd in hog:
            os.close(fd)
        print("three accept errors", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await server.stop()

    asyncio.run(main())
""")


def test_running_out_of_descriptors_is_reported_once_not_once_per_connection():
    proc = subprocess.Popen([sys.executable, "-c", EMFILE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        clients = []
        for _ in range(60):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            clients.append(sock)
        # Three rounds of accept errors (asyncio retries once a second) are three reports without
        # the throttle, and before the guard dozens per second: one per pending connection.
        assert proc.stdout.readline().strip() == "three accept errors"
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        for sock in clients:
            sock.close()
    reports = [line for line in err.splitlines() if "cannot accept" in line or "out of system resource" in line]
    assert len(reports) == 1, err[-3000:]
    assert "Too many open files" in reports[0]
    assert "Traceback" not in err
