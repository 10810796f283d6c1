"""The relay inside a harness's sandbox: a loopback TCP port that reaches the rollout's model endpoint.

The sandbox server listens for the harness on a unix socket bound into the slot (read-only, at
/run/rollouts/model.sock); most harnesses speak HTTP over TCP only. This program, run by the
slot's own python3 as the slot's uid, listens on 127.0.0.1 in the slot's network namespace, prints
the port it got, and copies bytes both ways between each connection and the socket. It adds no
access of its own: the endpoint checks the harness's key on every request, so a process that
reaches this port (another slot's, when the network is on and the slots share the host's) gains
nothing without the key. Standard library only, since a slot has nothing else.
"""

from __future__ import annotations

import asyncio
import sys

CHUNK = 64 * 1024


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(socket_path: str) -> None:
    async def connect(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            endpoint_reader, endpoint_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, endpoint_writer), pipe(endpoint_reader, client_writer))

    server = await asyncio.start_server(connect, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    sys.stdout.close()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
