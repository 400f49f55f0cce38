"""Pop consumption rules without I/O: cursors, selection, receipt handles, in-flight checks,
the replicated state's fold, FIFO gates, the revive schedule, topic attributes and the
wire pieces (batch-ack bit sets, subscription groups)."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqha.errors import ConfigError, ProtocolError, ReceiptError
from rmqha.messaging.pop_logic import (
    FifoGate,
    ReviveAction,
    check_in_flight,
    check_request,
    fifo_gate,
    fifo_unblocks_at,
    initial_cursor,
    next_pop_time,
    retry_delay_level,
    revive_plan,
    select,
)
from rmqha.messaging.pop_state import (
    COMPACT_EVERY,
    InFlight,
    PopQueue,
    PopState,
    ack_record,
    batch_record,
    change_record,
    revive_record,
)
from rmqha.messaging.receipt import ReceiptHandle, Refusal, parse, verify
from rmqha.messaging.state import BrokerState, group_put_record, pop_record
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.protocol.pop import (
    ConsumeInitMode,
    QueueInfo,
    bitset_encode,
    bitset_offsets,
    original_topic,
    parse_batch_ack_body,
    pop_retry_topic,
    real_topic,
    retry_flag,
)
from rmqha.protocol.topic_attributes import (
    TopicMessageType,
    alter,
    message_type_of,
    parse_modification,
    type_mismatch,
)
from rmqha.protocol.topics import TopicConfig, TopicTable

KEY = b"k" * 32
G = "grp"


def handle(**kw: object) -> ReceiptHandle:
    fields: dict[str, object] = {
        "ck_offset": 5, "pop_time": 1_000, "invisible_time": 30_000, "revive_qid": 0,
        "retry": "0", "broker_name": "broker-a", "queue_id": 2, "offset": 7, "epoch": 3,
        "retry_count": 0, "topic": "T"}
    fields.update(kw)
    return ReceiptHandle(**fields)  # type: ignore[arg-type]


# --- cursors and selection ---------------------------------------------------------------


def test_initial_cursor_per_init_mode() -> None:
    common: dict[str, Any] = {"committed": None, "retry_topic": False, "young": False}
    assert initial_cursor(ConsumeInitMode.MIN, 3, 10, **common) == 3
    # MAX pops the newest message (RocketMQ: max - 1), and an empty queue starts at its start.
    assert initial_cursor(ConsumeInitMode.MAX, 3, 10, **common) == 9
    assert initial_cursor(ConsumeInitMode.MAX, 0, 0, **common) == 0
    # A young queue (first message still in memory) and a retry topic start at the start.
    assert initial_cursor(ConsumeInitMode.MAX, 0, 10, committed=None, retry_topic=False,
                          young=True) == 0
    assert initial_cursor(ConsumeInitMode.MAX, 2, 10, committed=None, retry_topic=True,
                          young=False) == 2
    # A group's committed (pull) offset wins, clamped into the queue.
    assert initial_cursor(ConsumeInitMode.MAX, 3, 10, committed=6, retry_topic=False,
                          young=False) == 6
    assert initial_cursor(ConsumeInitMode.MIN, 3, 10, committed=1, retry_topic=False,
                          young=False) == 3


def test_select_filters_counts_and_budgets_bytes() -> None:
    tags = [1, 2, 1, 1, 2, 1]
    sizes = [100] * 6
    # Tag filter: skipped messages move the cursor, matching ones are taken up to the count.
    sel = select(10, tags, sizes, {1}, 2, 10_000)
    assert (sel.offsets, sel.next_cursor) == ([10, 12], 13)
    # Byte budget: stop before the message that does not fit, but always take one.
    assert select(10, tags, sizes, None, 10, 250).offsets == [10, 11]
    assert select(10, tags, [500] * 6, None, 10, 100).offsets == [10]
    # Nothing matches: nothing taken, the cursor passes everything looked at.
    sel = select(10, tags, sizes, {9}, 5, 10_000)
    assert (sel.offsets, sel.next_cursor) == ([], 16)


# --- receipt handles -----------------------------------------------------------------------


def test_handle_round_trips_and_keeps_rocketmq_fields() -> None:
    h = handle()
    text = h.sign(KEY, G)
    parts = text.split(" ")
    # RocketMQ's ExtraInfoUtil fields first, in its order.
    assert parts[:8] == ["5", "1000", "30000", "0", "0", "broker-a", "2", "7"]
    assert verify(text, KEY, G, "broker-a") == h
    # Fields after the MAC are ignored (RocketMQ's proxy appends a commitlog offset).
    assert verify(text + " 123456", KEY, G, "broker-a") == h


# Field 5, the broker name, is checked before the MAC (see the refusals below).
@pytest.mark.parametrize("index", [i for i in range(11) if i != 5])
def test_changing_any_field_breaks_the_signature(index: int) -> None:
    parts = handle().sign(KEY, G).split(" ")
    parts[index] = parts[index] + "1"
    with pytest.raises(ReceiptError) as exc:
        verify(" ".join(parts), KEY, G, "broker-a")
    assert exc.value.status == Refusal.FORGED.value


def test_handle_refusals_name_their_reason() -> None:
    text = handle().sign(KEY, G)

    def status(t: str, key: bytes = KEY, group: str = G, broker: str = "broker-a") -> str:
        with pytest.raises(ReceiptError) as exc:
            verify(t, key, group, broker)
        return exc.value.status

    assert status(text, group="other") == "FORGED"          # another group's handle
    assert status(text, key=b"x" * 32) == "FORGED"          # another broker group's key
    assert status(text, broker="broker-b") == "WRONG_BROKER"
    assert status(" ".join(text.split(" ")[:8])) == "UNSIGNED"  # RocketMQ's plain extraInfo
    assert status("1 2 3") == "MALFORMED"
    assert status(text.replace("1000", "x", 1)) == "MALFORMED"
    assert Refusal.FORGED.code == ResponseCode.MESSAGE_ILLEGAL
    assert Refusal.EXPIRED.code == ResponseCode.NO_MESSAGE
    # A control: the untouched handle passes.
    assert verify(text, KEY, G, "broker-a").offset == 7


def test_request_must_name_what_the_handle_names() -> None:
    check_request(handle(), G, "T", 2, 7)
    retry = handle(retry="1", topic=pop_retry_topic(G, "T"), queue_id=0)
    # A client may name the original topic or the retry topic for a retried message.
    check_request(retry, G, "T", 0, 7)
    check_request(retry, G, pop_retry_topic(G, "T"), 0, 7)
    for topic, queue_id, offset in (("U", 2, 7), ("T", 1, 7), ("T", 2, 8)):
        with pytest.raises(ReceiptError) as exc:
            check_request(handle(), G, topic, queue_id, offset)
        assert exc.value.status == "MISMATCH"


def _state_with(entry: InFlight, offset: int = 7) -> PopState:
    state = PopState()
    state.queues[(G, "T", 2)] = PopQueue(8, {offset: entry})
    return state


def test_in_flight_check_expired_acked_superseded() -> None:
    h = handle()
    entry = InFlight(1_000, 30_000, 0, 5, 3, False)
    assert check_in_flight(_state_with(entry), G, h, 2_000) is entry

    def status(state: PopState, now: int) -> str:
        with pytest.raises(ReceiptError) as exc:
            check_in_flight(state, G, h, now)
        return exc.value.status

    assert status(_state_with(entry), 31_000) == "EXPIRED"
    assert status(PopState(), 2_000) == "NOT_IN_FLIGHT"
    newer = InFlight(1_500, 30_000, 0, 7, 3, False)
    assert status(_state_with(newer), 2_000) == "SUPERSEDED"
    assert status(_state_with(newer), 40_000) == "SUPERSEDED"
    # Not replicated before a failover: the broker has an older delivery only.
    older = InFlight(900, 30_000, 0, 5, 3, False)
    assert status(_state_with(older), 2_000) == "NOT_IN_FLIGHT"


def test_next_pop_time_is_after_the_previous() -> None:
    assert next_pop_time(5_000, 1_000) == 5_000
    assert next_pop_time(1_000, 1_000) == 1_001


# --- the replicated state ----------------------------------------------------------------


def _batch(pt: int = 1_000, it: int = 30_000, fifo: bool = False,
           offsets: tuple[int, ...] = (0, 1, 2)) -> dict:
    return batch_record(pt, it, 3, fifo, [[G, "T", 0, offsets[0], offsets[-1] + 1,
                                           [[o, 0] for o in offsets]]])


def test_fold_pop_ack_change_revive() -> None:
    s = PopState()
    s.apply("pop_batch", _batch())
    pq = s.queue((G, "T", 0))
    assert pq is not None and pq.cursor == 3 and sorted(pq.inflight) == [0, 1, 2]
    s.apply("pop_ack", ack_record([[G, "T", 0, 0, 1_000]]))
    # A stale ack (another pop time) changes nothing: the negative control of the rule.
    s.apply("pop_ack", ack_record([[G, "T", 0, 1, 999]]))
    assert sorted(pq.inflight) == [1, 2]
    s.apply("pop_change", change_record([[G, "T", 0, 1, 1_000, 2_000, 5_000]]))
    assert (pq.inflight[1].pop_time, pq.inflight[1].deadline, pq.inflight[1].ck_offset) == (
        2_000, 7_000, 1)
    s.apply("pop_revive", revive_record([[G, "T", 0, 2, 1_000]]))
    assert sorted(pq.inflight) == [1]
    # The cursor never moves back.
    s.apply("pop_batch", batch_record(3_000, 1, 3, False, [[G, "T", 0, 0, 1, []]]))
    assert pq.cursor == 3


def test_due_yields_expired_entries_once_in_deadline_order() -> None:
    s = PopState()
    s.apply("pop_batch", _batch(pt=1_000, it=500, offsets=(0,)))
    s.apply("pop_batch", batch_record(1_000, 100, 3, False, [[G, "T", 0, 1, 2, [[1, 0]]]]))
    s.apply("pop_batch", batch_record(1_000, 900, 3, False, [[G, "T", 0, 2, 3, [[2, 0]]]]))
    s.apply("pop_ack", ack_record([[G, "T", 0, 2, 1_000]]))
    assert [off for _, off, _ in s.due(1_050)] == []
    assert [off for _, off, _ in s.due(1_600)] == [1, 0]
    assert [off for _, off, _ in s.due(5_000)] == []  # acked ones never come
    # A changed entry is due at its new deadline only.
    s.apply("pop_batch", batch_record(6_000, 100, 3, False, [[G, "T", 0, 3, 4, [[3, 0]]]]))
    s.apply("pop_change", change_record([[G, "T", 0, 3, 6_000, 6_050, 1_000]]))
    assert [off for _, off, _ in s.due(6_500)] == []
    assert [off for _, off, _ in s.due(7_100)] == [3]


def test_checkpoint_round_trip_and_drop_topic() -> None:
    s = PopState()
    s.apply("pop_key", {"key": "a2V5"})
    s.apply("pop_batch", _batch(fifo=True))
    copy = PopState()
    copy.load(json.loads(json.dumps(s.to_json())))
    assert copy.to_json() == s.to_json() and copy.key == b"key"
    assert copy.entry((G, "T", 0), 1) == s.entry((G, "T", 0), 1)
    assert [off for _, off, _ in copy.due(10**9)] == [0, 1, 2]
    s.drop_topic("T")
    assert s.queue((G, "T", 0)) is None


def test_broker_state_folds_pop_and_group_records_and_checkpoints_them() -> None:
    state = BrokerState(TopicTable())
    state.apply(pop_record(_batch()), persist=False)
    state.apply(group_put_record(SubscriptionGroupConfig(G, consume_message_orderly=True,
                                                         retry_max_times=3)), persist=False)
    assert state.pop.in_flight_count() == 3
    cfg = state.groups.get(G)
    assert cfg is not None and cfg.consume_message_orderly and cfg.retry_max_times == 3
    other = BrokerState(TopicTable())
    other.apply(state.checkpoint_record(), persist=False)
    assert other.pop.to_json() == state.pop.to_json()
    assert other.groups.get(G) == cfg
    state.apply(json.dumps({"op": "topic_delete", "topic": "T"}).encode(), persist=False)
    assert state.pop.in_flight_count() == 0


# --- FIFO and revive -------------------------------------------------------------------------


def test_fifo_gate() -> None:
    def queue(*entries: tuple[int, int, int]) -> PopQueue:
        return PopQueue(10, {off: InFlight(pt, 100, rc, 0, 1, True) for off, pt, rc in entries})

    assert fifo_gate(None, 0, 3) == (FifoGate.FREE, [])
    assert fifo_gate(PopQueue(4), 0, 3) == (FifoGate.FREE, [])
    # One message still invisible blocks the queue, even if the others are visible.
    blocked = queue((5, 1_000, 0), (6, 1_050, 0))
    assert fifo_gate(blocked, 1_120, 3)[0] is FifoGate.BLOCKED
    assert fifo_unblocks_at(blocked) == 1_150
    # All visible: delivered again in order.
    assert fifo_gate(blocked, 1_150, 3) == (FifoGate.REDELIVER, [5, 6])
    # The first reached the retry limit: nothing until it went to the DLQ.
    assert fifo_gate(queue((5, 0, 3), (6, 0, 0)), 500, 3)[0] is FifoGate.DEAD_LETTER_PENDING
    # A later one at the limit: redeliver up to it.
    assert fifo_gate(queue((5, 0, 1), (6, 0, 3), (7, 0, 0)), 500, 3) == (FifoGate.REDELIVER, [5])


def test_revive_schedule_backoff_dlq_and_fifo() -> None:
    def entry(rc: int, fifo: bool = False) -> InFlight:
        return InFlight(0, 1, rc, 0, 1, fifo)

    # RocketMQ's backoff: level 3 + retry count (10s, 30s, 1m, ...), capped at the last level.
    assert [retry_delay_level(rc, 18) for rc in (0, 1, 2, 15, 16)] == [3, 4, 5, 18, 18]
    plans = [revive_plan(entry(rc), 16, backoff=True, max_level=18) for rc in range(18)]
    assert [p.action for p in plans[:16]] == [ReviveAction.RETRY] * 16
    assert [p.delay_level for p in plans[:3]] == [3, 4, 5]
    assert plans[16].action is ReviveAction.DEAD_LETTER and plans[17].action is ReviveAction.DEAD_LETTER
    assert revive_plan(entry(0), 16, backoff=False, max_level=18).delay_level == 0
    assert revive_plan(entry(1), 1, backoff=True, max_level=18).action is ReviveAction.DEAD_LETTER
    # FIFO: left in its queue below the limit, dead-lettered at it.
    assert revive_plan(entry(2, True), 3, backoff=True, max_level=18).action is ReviveAction.LEAVE
    assert revive_plan(entry(3, True), 3, backoff=True, max_level=18).action is (
        ReviveAction.DEAD_LETTER)


# --- wire pieces ---------------------------------------------------------------------------


def test_retry_topic_names_and_flags() -> None:
    retry = pop_retry_topic(G, "T")
    assert retry == "%RETRY%grp_T"
    assert (retry_flag("T"), retry_flag(retry)) == ("0", "1")
    assert real_topic("T", G, "1") == retry and real_topic(retry, G, "1") == retry
    assert real_topic("T", G, "0") == "T"
    assert original_topic(retry, G) == "T" and original_topic("T", G) == "T"
    with pytest.raises(ProtocolError):
        real_topic("T", G, "9")


def test_queue_info_header_fields() -> None:
    info = QueueInfo()
    info.add("T", 1, 4, [4, 6])
    info.add(pop_retry_topic(G, "T"), 0, 9, [9], [2])
    assert info.header() == {"startOffsetInfo": "0 1 4;1 0 9", "msgOffsetInfo": "0 1 4,6;1 0 9",
                             "orderCountInfo": "1 qo0%9 2"}


def test_batch_ack_body_and_java_bitset() -> None:
    # Java: BitSet{0, 2, 9}.toByteArray() = [0x05, 0x02], fastjson writes base64.
    assert bitset_encode([0, 2, 9]) == "BQI="
    assert bitset_offsets("BQI=", 100) == [100, 102, 109]
    body = json.dumps({"brokerName": "broker-a", "acks": [{
        "c": G, "t": "T", "r": "0", "so": 100, "q": 1, "rq": 0, "pt": 5, "it": 6, "b": "BQI=",
        "rh": ["h1"]}]}).encode()
    broker, entries = parse_batch_ack_body(body)
    assert broker == "broker-a" and entries[0].offsets == [100, 102, 109]
    assert entries[0].handles == ["h1"] and entries[0].group == G
    bad_bitset = b'{"acks": [{"c": "g", "t": "T", "so": 1, "q": 0, "pt": 1, "it": 1, "b": "%%"}]}'
    for bad in (b"[]", b'{"acks": [{"c": "g"}]}', bad_bitset, b"nope"):
        with pytest.raises(ProtocolError):
            parse_batch_ack_body(bad)


def test_subscription_group_round_trip_keeps_unknown_fields() -> None:
    data = {"groupName": G, "consumeMessageOrderly": True, "retryMaxTimes": 2,
            "groupRetryPolicy": {"type": "CUSTOMIZED"}}
    cfg = SubscriptionGroupConfig.from_rocketmq(data)
    assert cfg.consume_message_orderly and cfg.retry_max_times == 2 and cfg.consume_enable
    out = cfg.to_rocketmq()
    assert out["groupRetryPolicy"] == {"type": "CUSTOMIZED"} and out["retryMaxTimes"] == 2
    for bad in ({"retryMaxTimes": 1}, {"groupName": "a b"}, {"groupName": G, "retryMaxTimes": -1},
                {"groupName": G, "consumeEnable": "maybe"}):
        with pytest.raises(ConfigError):
            SubscriptionGroupConfig.from_rocketmq(bad)


def test_topic_attributes_as_rocketmq_alters_them() -> None:
    assert parse_modification("+message.type=FIFO,-reserve.time") == {
        "+message.type": "FIFO", "-reserve.time": ""}
    created = alter({}, parse_modification("+message.type=FIFO"), create=True)
    assert created == {"message.type": "FIFO"}
    assert alter(created, {}, create=False) == created  # no attributes: kept
    assert alter(created, parse_modification("+message.type=DELAY"), create=False) == {
        "message.type": "DELAY"}
    assert alter(created, parse_modification("-message.type"), create=False) == {}
    for text, current, create in (("message.type=FIFO", {}, True), ("+message.type=BOGUS", {}, True),
                                  ("+color=red", {}, True), ("-message.type", {}, True),
                                  ("-message.type", {}, False),
                                  ("+queue.type=BatchCQ", {"queue.type": "SimpleCQ"}, False),
                                  ("+a=1,+a=2", {}, True)):
        with pytest.raises(ConfigError):
            alter(current, parse_modification(text), create=create)
    assert TopicConfig.from_rocketmq(TopicConfig("T", attributes=created).to_rocketmq()).attributes == created


def test_message_types_and_the_send_check() -> None:
    assert message_type_of({}) is TopicMessageType.NORMAL
    assert message_type_of({"__SHARDINGKEY": "g1"}) is TopicMessageType.FIFO
    assert message_type_of({"DELAY": "3"}) is TopicMessageType.DELAY
    assert message_type_of({"TIMER_DELAY_SEC": "3"}) is TopicMessageType.DELAY
    assert message_type_of({"TRAN_MSG": "true"}) is TopicMessageType.TRANSACTION
    assert message_type_of({}, prepared=True) is TopicMessageType.TRANSACTION
    assert type_mismatch(TopicMessageType.FIFO, TopicMessageType.FIFO) is None
    assert type_mismatch(TopicMessageType.MIXED, TopicMessageType.DELAY) is None
    text = type_mismatch(TopicMessageType.FIFO, TopicMessageType.NORMAL)
    assert text == ("TopicMessageType validate failed, the expected type is FIFO, but actual "
                    "type is NORMAL")


def test_parse_refuses_unsigned_and_malformed() -> None:
    with pytest.raises(ReceiptError):
        parse("1 2 3 4 5 b 6 7")
    assert parse(handle().sign(KEY, G)).topic == "T"


# --- garbage in --------------------------------------------------------------------------------

FUZZ = settings(max_examples=200, deadline=None)


@FUZZ
@given(st.text(max_size=200))
def test_any_text_as_a_handle_is_refused_with_a_receipt_error(text: str) -> None:
    try:
        verify(text, KEY, G, "broker-a")
    except ReceiptError as exc:
        assert exc.status in {r.value for r in Refusal}


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.builds(
    lambda acks: json.dumps({"acks": acks}).encode(),
    st.lists(st.dictionaries(st.sampled_from(["c", "t", "so", "q", "pt", "it", "b", "rh", "r"]),
                             st.one_of(st.integers(), st.text(max_size=8), st.none(),
                                       st.lists(st.integers(), max_size=2))), max_size=3))))
def test_any_batch_ack_body_parses_or_raises_protocol_error(body: bytes) -> None:
    try:
        parse_batch_ack_body(body)
    except ProtocolError:
        pass


def test_stale_deadlines_are_compacted_away() -> None:
    """A slave folds pops and acks but never takes anything due: the deadline heap must not
    grow with every pop ever made."""
    s = PopState()
    for i in range(3 * COMPACT_EVERY):
        s.apply("pop_batch", batch_record(i, 10**9, 1, False, [[G, "T", 0, i, i + 1, [[i, 0]]]]))
        s.apply("pop_ack", ack_record([[G, "T", 0, i, i]]))
    live = 5
    for i in range(live):
        off = 10**6 + i
        s.apply("pop_batch", batch_record(1, 10, 1, False, [[G, "T", 1, off, off + 1, [[off, 0]]]]))
    assert len(s._due) <= COMPACT_EVERY + live
    # Compaction keeps what is live.
    assert len(list(s.due(10**12))) == live
