"""grpcio's own cost per call: a grpc.aio server whose one unary method does nothing.

``benches/bench_proxy.py`` runs this as a process of its own (``python
benches/grpc_floor_server.py PORT``), calls ``/bench.Floor/Echo`` N times from the bench
process and reads the server's CPU from ``/proc/<pid>/stat``: what grpcio's server
(HTTP/2 framing, the completion queue, the asyncio bridge, the handler's task) costs per
unary call before any proxy code runs.  It serves the same options the proxy serves
(:data:`rmqha.proxy.server.SERVER_OPTIONS`), plaintext on 127.0.0.1, until killed.
"""
from __future__ import annotations

import asyncio
import sys

import grpc

from rmqha.proxy.server import SERVER_OPTIONS

METHOD = "/bench.Floor/Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def serve(port: int) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    handler = grpc.unary_unary_rpc_method_handler(_echo)   # bytes in, bytes out: no protobuf
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Floor", {"Echo": handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
