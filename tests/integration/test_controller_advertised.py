"""Controllers name their leader by the address it advertises (issue 40.5).

Three real controllers, each with an ``advertised_address`` (a NAT's or proxy's address:
here free loopback ports nobody listens on, since only the naming is under test): every
controller's GET_METADATA_INFO and every follower's CONTROLLER_NOT_LEADER answer name the
leader by its advertised address, never by its controller_peers address.  The control:
a group without advertised addresses names the leader's controller_peers address, as
before (the default changes nothing)."""
from __future__ import annotations

from pathlib import Path

import pytest
from cluster import Cluster, ControllerProc, free_port

from rmqha.protocol.codes import RequestCode, ResponseCode


def _leader_named_everywhere(c: Cluster, want: str) -> None:
    """Every controller names ``want`` as the leader, in metadata and NOT_LEADER answers."""
    c.wait_for(lambda: all((c.controller_metadata(p.address) or {}).get("controllerLeaderAddress") == want
                           for p in c.controllers), 15, what=f"every controller naming the leader {want}")
    leader = c.controller_leader()
    for p in c.controllers:
        if p.address == leader:
            continue
        resp = c.request(p.address, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": "nobody"})
        assert resp.code == ResponseCode.CONTROLLER_NOT_LEADER, resp.remark
        assert resp.ext_fields["controllerLeaderAddress"] == want and want in resp.remark


def _leading(c: Cluster, skip: int) -> ControllerProc | None:
    """The live controller that says it leads, other than controller ``skip``."""
    for i, p in enumerate(c.controllers):
        if i != skip and (c.controller_metadata(p.address) or {}).get("isLeader") == "true":
            return p
    return None


@pytest.mark.parametrize("advertise", [True, False], ids=["advertised", "control: default"])
def test_followers_name_the_leader_by_the_address_it_advertises(tmp_path: Path, advertise: bool) -> None:
    with Cluster(tmp_path) as c:
        advertised = {i: {"advertised_address": f"127.0.0.1:{free_port()}"} for i in range(3)}
        c.start_controllers(3, per_node=advertised if advertise else None)
        leader = c.controller_leader()
        index = [p.address for p in c.controllers].index(leader)
        want = advertised[index]["advertised_address"] if advertise else leader
        _leader_named_everywhere(c, want)
        if not advertise:
            return
        # A new leader (the old one killed) is named by its own advertised address.
        c.controllers[index].kill()
        new_index = c.controllers.index(c.wait_for(lambda: _leading(c, skip=index), 30,
                                                   what="a new controller leader"))
        c.controllers[index].start()
        _leader_named_everywhere(c, advertised[new_index]["advertised_address"])


def test_a_bad_advertised_address_is_refused_naming_the_key(tmp_path: Path) -> None:
    from rmqha.controller.config import ControllerConfig
    from rmqha.errors import ConfigError

    with pytest.raises(ConfigError, match="advertised_address: bad address 'nohost'"):
        ControllerConfig(advertised_address="nohost", allow_insecure=True).validate()
