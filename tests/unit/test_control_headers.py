"""The controller's header classes, requests and answers: what one side builds is what the
other parses, field by field, and a malformed header is refused naming its field.

The wire names are RocketMQ's (a Java broker's request parses the same): the last test
feeds the controller's logic the fields as RocketMQ 5's broker writes them (``null`` for an
absent Long) and, as a negative control, a header missing its group name.
"""
from __future__ import annotations

import dataclasses

import pytest

from rmqha.controller.heartbeat import BrokerHeartbeatManager
from rmqha.controller.logic import BadRequest, ControllerLogic
from rmqha.controller.state import ReplicasState
from rmqha.errors import ProtocolError
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.control_headers import (
    AlterSyncStateSetAnswer,
    AlterSyncStateSetHeader,
    ApplyBrokerIdHeader,
    BrokerHeartbeatHeader,
    CleanBrokerDataHeader,
    ElectMasterAnswer,
    ElectMasterHeader,
    GetNextBrokerIdHeader,
    GetReplicaInfoHeader,
    HeartbeatAnswerHeader,
    NextBrokerIdAnswer,
    RegisterBrokerAnswer,
    RegisterBrokerToControllerHeader,
    ReplicaInfoAnswer,
    RoleChangedHeader,
)

SAMPLES = [
    GetNextBrokerIdHeader(cluster_name="c", broker_name="g"),
    ApplyBrokerIdHeader(cluster_name="c", broker_name="g", applied_broker_id=2, register_check_code="addr;1"),
    RegisterBrokerToControllerHeader(cluster_name="c", broker_name="g", broker_id=2, broker_address="h:1",
                                     invoke_time=5),
    BrokerHeartbeatHeader(cluster_name="c", broker_name="g", broker_id=1, broker_addr="h:1", epoch=3,
                          max_offset=10, confirm_offset=9, heartbeat_timeout_mills=1000, election_priority=None),
    GetReplicaInfoHeader(broker_name="g"),
    AlterSyncStateSetHeader(broker_name="g", master_broker_id=1, master_epoch=2, invoke_time=5),
    ElectMasterHeader(cluster_name="c", broker_name="g", broker_id=2, designate_elect=True, invoke_time=5),
    CleanBrokerDataHeader(cluster_name="c", broker_name="g", broker_controller_ids_to_clean="1;2",
                          is_clean_living_broker=False, invoke_time=5),
    RoleChangedHeader(master_address="h:1", master_epoch=3, sync_state_set_epoch=4, master_broker_id=1),
    ReplicaInfoAnswer(master_broker_id=None, master_address=None, master_epoch=2),
    NextBrokerIdAnswer(cluster_name="c", broker_name="g", next_broker_id=3),
    RegisterBrokerAnswer(cluster_name="c", broker_name="g", master_broker_id=1, master_address="h:1",
                         master_epoch=2, sync_state_set_epoch=3),
    RegisterBrokerAnswer(cluster_name="c", broker_name="g", master_epoch=2, sync_state_set_epoch=3),
    ElectMasterAnswer(master_broker_id=2, master_address="h:2", master_epoch=4, sync_state_set_epoch=5),
    AlterSyncStateSetAnswer(new_sync_state_set_epoch=6),
    HeartbeatAnswerHeader(lease_granted=True, master_epoch=4, master_broker_id=1, heartbeat_timeout_ms=3000),
    HeartbeatAnswerHeader(lease_granted=False),
]


@pytest.mark.parametrize("header", SAMPLES, ids=lambda h: type(h).__name__)
def test_what_is_built_parses_back(header: object) -> None:
    assert type(header).parse(header.build()) == header  # type: ignore[attr-defined]


def test_java_nulls_are_absent_and_bad_fields_are_named() -> None:
    h = AlterSyncStateSetHeader.parse({"brokerName": "g", "masterBrokerId": "null", "masterEpoch": "3"})
    assert h.master_broker_id is None and h.master_epoch == 3
    assert ElectMasterHeader.parse({"brokerName": "g"}) == ElectMasterHeader(broker_name="g", broker_id=-1)
    with pytest.raises(ProtocolError, match="header field brokerName is required"):
        GetReplicaInfoHeader.parse({"brokerName": ""})
    with pytest.raises(ProtocolError, match="'masterEpoch' is not an integer"):
        AlterSyncStateSetHeader.parse({"brokerName": "g", "masterEpoch": "three"})


def test_the_controller_logic_reads_the_headers() -> None:
    logic = ControllerLogic(ReplicasState(), BrokerHeartbeatManager(1.0), False)
    java = {"clusterName": "c", "brokerName": "g"}
    assert logic.get_next_broker_id(java).ext_fields["nextBrokerId"] == "1"
    unknown = logic.get_replica_info(GetReplicaInfoHeader(broker_name="g").build())
    assert unknown.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
    with pytest.raises(BadRequest, match="brokerName is required"):
        logic.get_next_broker_id({"clusterName": "c"})  # negative control: the name is checked
    built = dataclasses.replace(SAMPLES[1], applied_broker_id=None).build()
    assert "appliedBrokerId" not in built
