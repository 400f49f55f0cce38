"""The proxy's gRPC calls stand for declared request codes (rmqha.protocol.code_rules).

Every RPC of ``MessagingService`` is either served, standing for a code whose declaration
says the proxy serves it and from which its ACL needs are read, or answered
NOT_IMPLEMENTED; a new RPC without either fails here by name.
"""
from __future__ import annotations

from rocketmq.grpc_protocol import service_pb2_grpc

from rmqha.protocol.code_rules import Server, codes_served_by
from rmqha.proxy.service import RPC_CODES, UNSERVED_RPCS, MessagingService, needs_of
from rmqha.security.acl import Perm


def test_every_proxy_rpc_stands_for_a_declared_code() -> None:
    """The proxy's served RPCs (the servicer methods it overrides that answer more than
    NOT_IMPLEMENTED) each stand for a code whose declaration says the proxy serves it."""
    base = service_pb2_grpc.MessagingServiceServicer
    rpcs = {name for name in vars(base) if not name.startswith("_")}
    overridden = {name for name in rpcs if vars(MessagingService).get(name) is not vars(base)[name]}
    assert overridden == rpcs, sorted(rpcs - overridden)  # each answers, served or NOT_IMPLEMENTED
    assert sorted(rpcs - UNSERVED_RPCS - set(RPC_CODES)) == []
    assert set(RPC_CODES.values()) == codes_served_by(Server.PROXY)


def test_proxy_needs_come_from_the_declarations() -> None:
    assert needs_of("SendMessage", ["T"], ["PG"]).resources() == {"T": Perm.PUB}
    assert needs_of("SendMessage", ["%DLQ%theirs"]).resources() == {"%RETRY%theirs": Perm.SUB}
    assert needs_of("ReceiveMessage", ["T"], ["G"]).resources() == {"%RETRY%G": Perm.SUB, "T": Perm.SUB}
    assert needs_of("QueryRoute", ["T"]).resources() == {"T": Perm.ANY}
    assert needs_of("EndTransaction", ["T"]).resources() == {"T": Perm.PUB}
