"""Transactional messages against in-process brokers (real sockets, real commitlog).

Commit, rollback, the broker's check-back to a producer of the group, discarding after
``transaction_check_max`` checks, repeated END_TRANSACTION, and the pending set rebuilt
from the log on restart.  The failover across real processes is in
``test_transactions_cluster.py``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from test_messaging import Env, LocalBroker, consume, create_topic, run

from rmqha.client import LocalTransactionState, Message, Producer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.testing.ha import wait_until_async
from rmqha.protocol.message import Prop, SysFlag, parse_offset_msg_id
from rmqha.messaging.transactions import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, Outcome
from rmqha.net.client import RemotingClient
from rmqha.protocol.command import RemotingCommand

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
#: Check-backs within a second, so a test takes a few.
QUICK_CHECKS = {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300}


def never_checked(msg: Any) -> LocalTransactionState:
    raise AssertionError(f"unexpected check-back of {msg.msg_id}")


def test_commit_is_visible_and_rollback_is_not(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "tx", 2)
            async with Producer(env.namesrv, "PG_TX") as p:
                p.set_transaction_check_listener(never_checked)
                ran: list[Any] = []

                def commit(msg: Message, arg: Any) -> LocalTransactionState:
                    ran.append(arg)
                    return COMMIT

                async def rollback(msg: Message, arg: Any) -> LocalTransactionState:
                    return ROLLBACK

                c = await p.send_transaction("tx", Message(b"kept", tags="T"), commit, arg=7)
                r = await p.send_transaction("tx", Message(b"dropped"), rollback)
                assert ran == [7]
                assert (c.state, c.end_confirmed, r.state, r.end_confirmed) == (
                    COMMIT, True, ROLLBACK, True)
                # The half messages live in the half topic, never in "tx" before the commit.
                assert c.send_result.queue.topic == "tx"
                assert b.svc.index.queue(HALF_TOPIC, 0).max_offset == 2
                assert b.svc.index.queue(OP_TOPIC, 0).max_offset == 2
                assert not b.svc.transactions.pending
                plain = await p.send("tx", b"plain")
            got = await consume(env.namesrv, "CG_TX", "tx", 2, timeout=10)
            assert sorted(m.body for m in got) == [b"kept", b"plain"]
            kept = next(m for m in got if m.body == b"kept")
            assert kept.msg_id == c.msg_id and kept.tags == "T"
            assert kept.sys_flag & SysFlag.TRANSACTION_COMMIT
            assert Prop.REAL_TOPIC not in kept.properties
            assert plain.ok
            # A repeated END is answered without writing again; the other outcome is refused.
            _, offset = parse_offset_msg_id(c.send_result.offset_msg_id)
            async with RemotingClient(b.address) as rc:
                for kind, code in ((SysFlag.TRANSACTION_COMMIT, ResponseCode.SUCCESS),
                                   (SysFlag.TRANSACTION_ROLLBACK, ResponseCode.SYSTEM_ERROR)):
                    resp = await rc.request(RemotingCommand.request(
                        RequestCode.END_TRANSACTION, {
                            "producerGroup": "PG_TX", "tranStateTableOffset": 0,
                            "commitLogOffset": offset, "commitOrRollback": int(kind),
                            "fromTransactionCheck": "false"}))
                    assert resp.code == code, resp.remark
                resp = await rc.request(RemotingCommand.request(RequestCode.END_TRANSACTION, {
                    "producerGroup": "OTHER", "tranStateTableOffset": 0,
                    "commitLogOffset": offset, "commitOrRollback": 8,
                    "fromTransactionCheck": "false"}))
                assert resp.code == ResponseCode.SYSTEM_ERROR and "group" in resp.remark
            assert b.svc.index.queue("tx", kept.queue_id).max_offset == (
                2 if plain.queue.queue_id == kept.queue_id else 1)

    run(main())


def test_unknown_outcome_is_checked_back_and_committed(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(**QUICK_CHECKS)
            await create_topic(b.address, "txc", 1)
            checked: list[Any] = []

            def check(msg: Any) -> LocalTransactionState:
                checked.append(msg)
                return COMMIT if msg.body == b"later-yes" else ROLLBACK

            async with Producer(env.namesrv, "PG_CHECK") as p:
                p.set_transaction_check_listener(check)
                yes = await p.send_transaction("txc", b"later-yes", lambda m, a: UNKNOW)
                no = await p.send_transaction("txc", b"later-no",
                                              lambda m, a: (_ for _ in ()).throw(
                                                  RuntimeError("local transaction failed")))
                assert (yes.state, no.state) == (UNKNOW, UNKNOW)
                assert not yes.end_confirmed
                await wait_until_async(lambda: not b.svc.transactions.pending, 15,
                               "both transactions to be settled by check-backs")
            assert {m.body for m in checked} == {b"later-yes", b"later-no"}
            assert all(int(m.properties[Prop.TRANSACTION_CHECK_TIMES]) == 1 for m in checked)
            assert b.svc.transactions.outcome(yes.msg_id) is Outcome.COMMIT
            assert b.svc.transactions.outcome(no.msg_id) is Outcome.ROLLBACK
            got = await consume(env.namesrv, "CG_CHECK", "txc", 1, timeout=10)
            assert [m.body for m in got] == [b"later-yes"]
            reg = b.metrics.registry
            assert reg.get_sample_value("rmqha_messaging_transaction_checks_total") == 2
            assert reg.get_sample_value("rmqha_messaging_transactions_ended_total",
                                        {"outcome": "commit"}) == 1
            assert reg.get_sample_value("rmqha_messaging_pending_half_messages") == 0

    run(main())


def test_unresolved_half_is_discarded_after_check_max(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker(transaction_timeout_ms=100, transaction_check_interval_ms=100,
                                 transaction_check_max=2)
            await create_topic(b.address, "txd", 1)
            checks: list[int] = []

            def check(msg: Any) -> LocalTransactionState:
                checks.append(int(msg.properties[Prop.TRANSACTION_CHECK_TIMES]))
                return UNKNOW

            async with Producer(env.namesrv, "PG_DISCARD") as p:
                p.set_transaction_check_listener(check)
                sent = await p.send_transaction("txd", b"limbo", lambda m, a: UNKNOW)
                await wait_until_async(lambda: b.svc.transactions.outcome(sent.msg_id), 15,
                               "the half message to be discarded")
            assert b.svc.transactions.outcome(sent.msg_id) is Outcome.DISCARD
            assert checks == [1, 2]
            assert b.svc.index.queue(CHECK_MAX_TOPIC, 0).max_offset == 1
            assert b.svc.index.queue("txd", 0) is None

    run(main())


def test_pending_halves_are_rebuilt_from_the_log_on_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "txr", 1)
            async with Producer(env.namesrv, "PG_R") as p:
                p.set_transaction_check_listener(never_checked)
                open_ = await p.send_transaction("txr", b"open", lambda m, a: UNKNOW)
                done = await p.send_transaction("txr", b"done", lambda m, a: COMMIT)
            assert done.end_confirmed
            await b.stop()
            again = LocalBroker(tmp_path, "broker-a", env.namesrv, **QUICK_CHECKS)
            again.port, again.address, again.store = b.port, b.address, b.store
            env.brokers.append(again)
            await again.start()
            pending = again.svc.transactions.pending
            assert [h.transaction_id for h in pending.values()] == [open_.msg_id]
            assert again.svc.transactions.outcome(done.msg_id) is Outcome.COMMIT
            # The restarted master checks it back with a producer of the group.
            # A new producer of the group, which only listens: its heartbeat names the
            # group, and the check comes back on that connection.
            async with Producer(env.namesrv, "PG_R") as p:
                p.set_transaction_check_listener(lambda m: COMMIT, topics=["txr"])
                await wait_until_async(lambda: not again.svc.transactions.pending, 15,
                               "the open transaction to be committed by a check-back")
            got = await consume(env.namesrv, "CG_R", "txr", 2, timeout=10)
            assert sorted(m.body for m in got) == [b"done", b"open"]

    run(main())


def test_bad_transactional_sends_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            async with RemotingClient(b.address) as rc:
                for topic in (HALF_TOPIC, OP_TOPIC):
                    resp = await rc.request(RemotingCommand.request(
                        RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": topic, "e": 0, "f": 0,
                                                      "m": "false"}, b"x"))
                    assert resp.code == ResponseCode.NO_PERMISSION, topic
                # A message may not claim to be committed or rolled back on its own.
                resp = await rc.request(RemotingCommand.request(
                    RequestCode.SEND_MESSAGE_V2, {"a": "p", "b": "t", "e": 0, "f": 0xC,
                                                  "m": "false"}, b"x"))
                assert resp.code == ResponseCode.MESSAGE_ILLEGAL
                resp = await rc.request(RemotingCommand.request(
                    RequestCode.END_TRANSACTION, {
                        "producerGroup": "p", "tranStateTableOffset": 0, "commitLogOffset": 999999,
                        "commitOrRollback": 8, "fromTransactionCheck": "false"}))
                assert resp.code == ResponseCode.SYSTEM_ERROR
                assert "prepared transaction message" in resp.remark
            # Only the broker marks a message as a committed transaction's.
            async with Producer(env.namesrv) as p:
                sent = await p.send("t", Message(b"m", properties={
                    Prop.TRANSACTION_PREPARED_QUEUE_OFFSET: "0"}))
            got = await consume(env.namesrv, "CG_MARK", "t", 1, timeout=10)
            assert [m.msg_id for m in got] == [sent.msg_id]
            assert Prop.TRANSACTION_PREPARED_QUEUE_OFFSET not in got[0].properties

    run(main())


def test_prepared_send_answer_names_its_transaction_id(tmp_path: Path) -> None:
    """As RocketMQ's broker, a prepared send's answer carries its unique key as
    ``transactionId`` (the Java client's ``TransactionSendResult.getTransactionId()``, sent
    back in END_TRANSACTION); a plain send's answer does not."""
    async def main() -> None:
        async with Env(tmp_path) as env:
            b = await env.broker()
            await create_topic(b.address, "tx", 1)
            async with RemotingClient(b.address) as rc:
                prepared = await rc.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
                    "a": "PG_TXID", "b": "tx", "e": 0, "f": int(SysFlag.TRANSACTION_PREPARED),
                    "m": "false", "i": f"{Prop.UNIQ_KEY}\x01TXID-1\x02"}, b"held"))
                assert prepared.code == ResponseCode.SUCCESS, prepared.remark
                assert prepared.ext_fields.get("transactionId") == "TXID-1"
                plain = await rc.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
                    "a": "PG_TXID", "b": "tx", "e": 0, "f": 0, "m": "false",
                    "i": f"{Prop.UNIQ_KEY}\x01PLAIN-1\x02"}, b"plain"))
                assert plain.code == ResponseCode.SUCCESS, plain.remark
                assert "transactionId" not in plain.ext_fields

    run(main())
