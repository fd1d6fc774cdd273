"""Added network latency without netem: a transparent TCP relay that holds every chunk of
data for ``--one-way-ms`` in each direction.

This machine's kernel is built without ``sch_netem`` (CONFIG_NET_SCH_NETEM is not set and
there are no modules), so ``tc qdisc ... netem delay`` is refused. Instead, an nftables
rule in the controller's own output path (only for the bench lab's subnet, port 22)
redirects SSH connections to this relay; the relay reads the original destination
(SO_ORIGINAL_DST), waits one and a half round trips (what the TCP handshake would cost
before the server's first byte), connects to the node with a firewall mark the redirect
rule skips, and forwards both directions, each chunk delivered ``one_way`` after it was
read, in order. Request/response exchanges such as SSH's therefore see one added RTT of
``2 * one_way`` per round trip; bulk transfer is not rate limited. Addresses, ports and
host keys are unchanged, so the tools and known_hosts work as without the relay.

Run by bench/latency.py; ``python bench/delay_relay.py --port P --one-way-ms 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import struct
import time

SO_ORIGINAL_DST = 80
BYPASS_MARK = 0x6662


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """The address a redirected connection was first sent to."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float) -> None:
    """Forward everything from ``reader`` to ``writer``, each chunk ``delay`` late."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
        await sender
    except (OSError, asyncio.IncompleteReadError):
        sender.cancel()


async def _connect_marked(address: str, port: int) -> tuple[asyncio.StreamReader,
                                                           asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, BYPASS_MARK)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (address, port))
    return await asyncio.open_connection(sock=sock)


async def _handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                  delay: float) -> None:
    sock = client_writer.get_extra_info("socket")
    try:
        address, port = original_destination(sock)
        await asyncio.sleep(3 * delay)  # SYN, SYN-ACK, ACK before the server sends a byte
        node_reader, node_writer = await _connect_marked(address, port)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(_pump(client_reader, node_writer, delay),
                             _pump(node_reader, client_writer, delay))
    finally:
        for w in (node_writer, client_writer):
            w.close()


async def serve(port: int, one_way_ms: float) -> None:
    delay = one_way_ms / 1000.0
    server = await asyncio.start_server(lambda r, w: _handle(r, w, delay), "127.0.0.1", port,
                                        backlog=1024)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Open connections die with the process: no drain is needed for a bench relay.
        loop.add_signal_handler(sig, os._exit, 0)
    print(f"relay listening on 127.0.0.1:{port}, {one_way_ms:g} ms each way", flush=True)
    async with server:
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--one-way-ms", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.one_way_ms))


if __name__ == "__main__":
    main()
