"""A stream whose connection the server cuts just as the client ends its names.

aiohttp writes a request body in its own task. When the client ends a stream's names
(`HttpChunkStream.end`) in the loop turn where the server's FIN is read, that task's
final write (the chunked body's end) finds the transport closing, and aiohttp closes
the connection under the response still being read: its protocol forgets the
response's payload before the connection-lost callback could fail it, and the stall
timer goes with it. Without `streaming.fail_reads_on_close` the next read waited
forever (the killed-connection sync test once hung 300 s).

The server here is raw asyncio over a real socket, so that it can send the last frame
and its FIN in one segment (``TCP_CORK``): the client then reads the frame and the
end of the connection in consecutive loop turns, every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from netopt.dataplane.chunkio import frame_header
from netopt.dataplane.client import ClientOptions, HttpChunkSource, parse_dataset_url
from netopt.errors import NetworkError

NAMES = ["a1" * 32, "b2" * 32, "c3" * 32]
PAYLOAD = b"x" * 100
HANG_BOUND_S = 10.0
"""Not a speed bound: the read must fail at once; without the fix it never returns
(the stall timeout is set far above this, so `_read_exactly`'s own bound stays out)."""


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of ``data``."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _frame(name: str) -> bytes:
    return frame_header(name, "identity", len(PAYLOAD)) + PAYLOAD


async def _read_until(reader: asyncio.StreamReader, seen: bytearray, mark: bytes) -> None:
    while mark not in seen:
        piece = await reader.read(4096)
        assert piece, "the client closed before naming what the server waits for"
        seen += piece


async def _cutting_server(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: list[str]
) -> None:
    """Answer the first name's frame; once the second and third names came, send the
    second's frame and the FIN in one segment (no chunked end: a cut connection)."""
    seen = bytearray()
    await _read_until(reader, seen, NAMES[0].encode())
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-netopt-frames\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(_frame(NAMES[0]))
    )
    await writer.drain()
    served.append(NAMES[0])
    await _read_until(reader, seen, NAMES[2].encode())
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)  # the FIN rides on the frame
    writer.write(_chunk(_frame(NAMES[1])))
    writer.write_eof()
    served.append(NAMES[1])
    with contextlib.suppress(ConnectionError):
        await reader.read()  # until the client closes its side
    writer.close()


async def test_stream_cut_as_its_names_end_fails_the_read() -> None:
    served: list[str] = []
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        await _cutting_server(reader, writer, served)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    options = ClientOptions(
        congestion_control=None, connect_timeout_s=2, read_timeout_s=5, stall_timeout_s=60
    )
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, options) as source:
            stream = source.open_stream()
            stream.ask(NAMES[0], len(PAYLOAD))
            first = await stream.next(NAMES[0], len(PAYLOAD))
            stream.ask(NAMES[1], len(PAYLOAD))
            stream.ask(NAMES[2], len(PAYLOAD))
            second = await stream.next(NAMES[1], len(PAYLOAD))
            # As the sync engine does once its queue is empty: in the same loop turn
            # as the frame, the stream names nothing more (the body's end is written).
            stream.end()
            with pytest.raises(NetworkError):
                async with asyncio.timeout(HANG_BOUND_S):
                    await stream.next(NAMES[2], len(PAYLOAD))
            assert stream.failed  # broken by the network, not cut by the client
            await stream.aclose(complete=False)
            # Its version is left to the sync's end (no question sent now, which would
            # wait on this server until the read timeout, 5 s).
            assert await asyncio.wait_for(source.version_at_end(), 1.0) is None
        assert first.payload == PAYLOAD
        assert second.payload == PAYLOAD
        assert served == NAMES[:2]
    finally:
        if handlers:  # each ends once the client closed its connection
            await asyncio.wait(handlers, timeout=HANG_BOUND_S)
        server.close()
        await server.wait_closed()
