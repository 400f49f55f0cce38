"""Auto-renew: the proxy keeps the invisible time of messages it handed out with
``auto_renew`` from running out while their client works on them (RocketMQ's
``ReceiptHandleProcessor`` with its ``DefaultReceiptHandleManager``).

RocketMQ 5's push consumers receive with ``auto_renew`` and never extend a message
themselves: the proxy does.  :meth:`Renewal.track` keeps each such delivery per client
(:class:`~rmqha.proxy.renewal_logic.DeliveryBook`); :meth:`Renewal.run` scans them every
``renewSchedulePeriodMillis`` and acts as :mod:`rmqha.proxy.renewal_logic` rules: renew
through CHANGE_MESSAGE_INVISIBLETIME on the master of the handle's group (the broker's new
handle replaces the one kept), hand back after ``renewMaxTimeMillis``, clear the
deliveries of a client that went away (terminated, its Telemetry stream closed, or silent
for ``channelExpiredTimeout``) so they are delivered again soon.  An ack, change or
dead-lettering from the client takes its delivery out first (:meth:`Renewal.settle`,
waiting for a renewal in flight) and is sent with the latest handle, so the client's
original handle keeps working.

The book lives in this process only, like RocketMQ's: a proxy that dies leaves its
deliveries to their invisible time (at least once: they are delivered again), and a
client must ack through the proxy it received from (another proxy sends its original
handle, which a renewal has replaced).  A proxy that stops clears its book first.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from rmqha.errors import ProxyError, RmqhaError
from rmqha.protocol.codes import RequestCode
from rmqha.protocol.command import RemotingCommand
from rmqha.proxy.clients import ClientRegistry, now_ms
from rmqha.proxy.cluster import ClusterAccess, Deadline, expect_success
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.handles import ReceiptHandle, compose_handle, parse_handle
from rmqha.proxy.renewal_logic import (
    Delivery,
    DeliveryBook,
    DeliveryKey,
    RenewRules,
    Step,
    client_gone,
    renew_failed,
    renewed,
    retry_delay_ms,
)
from rmqha.proxy.status import Code, ack_code

log = logging.getLogger(__name__)

#: How long a stopping proxy spends handing its deliveries back.
CLEAR_ON_STOP_S = 3.0
#: What a broker request of the background work may end with besides an answer.
FAILURES = (RmqhaError, OSError)


def _code(exc: BaseException) -> int:
    return exc.code if isinstance(exc, ProxyError) else Code.INTERNAL_SERVER_ERROR


async def change_invisible(cluster: ClusterAccess, group: str, topic: str, handle: ReceiptHandle,
                           invisible_ms: int, deadline: Deadline) -> str:
    """CHANGE_MESSAGE_INVISIBLETIME of ``handle``'s message; the new receipt handle."""
    header = {"consumerGroup": group, "topic": topic, "queueId": handle.queue_id,
              "extraInfo": handle.broker_handle, "offset": handle.offset,
              "invisibleTime": invisible_ms}
    resp = await cluster.to_master(
        topic, handle.broker_name,
        lambda: RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header),
        deadline, what="change invisible duration")
    expect_success(resp, "CHANGE_MESSAGE_INVISIBLETIME", ack_code)
    fresh = resp.ext_fields.get("extraInfo")
    if not fresh:
        raise ProxyError(Code.INTERNAL_SERVER_ERROR, "the broker answered no new receipt handle")
    return compose_handle(str(fresh), handle.commit_offset)


def delivery_key(group: str, message_id: str, handle: ReceiptHandle) -> DeliveryKey:
    return (group, message_id, handle.broker_name, handle.queue_id, handle.offset, handle.retry)


class Renewal:
    """The deliveries of auto_renew receives, renewed until their client settles them."""

    def __init__(self, cfg: ProxyConfig, cluster: ClusterAccess, clients: ClientRegistry) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.clients = clients
        self.rules = RenewRules.from_config(cfg)
        self.book = DeliveryBook()
        self._busy: dict[tuple[str, DeliveryKey], asyncio.Task[None]] = {}
        self._orphans: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self.cfg.enable_proxy_auto_renew

    # --- what the client's calls do ----------------------------------------------------

    def track(self, client_id: str, group: str, topic: str, messages: list[Any]) -> None:
        """Keep the deliveries of an auto_renew receive just answered (the client must
        have sent its Settings: one the proxy does not know is not renewed)."""
        if self.clients.seen_ms(client_id) is None:
            log.info("client %s received with auto_renew before its Settings: not renewed", client_id)
            return
        now = now_ms()
        for m in messages:
            sp = m.system_properties
            handle = parse_handle(sp.receipt_handle)
            self.book.add(client_id, Delivery(
                delivery_key(group, sp.message_id, handle), topic, sp.receipt_handle,
                now, now + handle.invisible_time, max(0, sp.delivery_attempt - 1)))

    async def settle(self, client_id: str, group: str, message_id: str, text: str) -> str:
        """The handle to ack, change or dead-letter with for the client's ``text``: the
        latest one if the proxy renews that delivery (which it stops doing)."""
        if not self.book.holds(client_id):
            return text  # a simple consumer's: nothing to look up
        try:
            key = delivery_key(group, message_id, parse_handle(text))
        except ProxyError:
            return text  # the caller refuses it
        d = self.book.take(client_id, key)
        if d is None:
            return text
        running = self._busy.get((client_id, key))
        if running is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(running)
        return d.handle

    def hand_back(self, group: str, topic: str, messages: list[Any]) -> None:
        """Messages popped for a receive whose client went away before they were written
        to it (RocketMQ's ``processThrowableWhenWriteMessage``): visible again after
        ``invisibleTimeMillisWhenClear`` instead of their whole invisible time."""
        for m in messages:
            task = asyncio.create_task(self._clear(group, topic, m.system_properties.receipt_handle))
            self._orphans.add(task)
            task.add_done_callback(self._orphans.discard)

    # --- the scan ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Scan every ``renewSchedulePeriodMillis`` until ``stop``; then hand back what
        is left."""
        period = self.cfg.renew_schedule_period_millis / 1000
        while not stop.is_set():
            self.scan()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    def scan(self) -> None:
        now = now_ms()
        for client_id in self.book.clients():
            if client_gone(self.clients.seen_ms(client_id), now, self.cfg.channel_expired_timeout):
                log.info("client %s is gone: its deliveries are handed back", client_id)
                for d in self.book.drop_client(client_id):
                    self._start(client_id, d, self._clear_delivery(d))
                continue
            for d, step in self.book.due(client_id, now, self.rules):
                if (client_id, d.key) not in self._busy:
                    act = self._renew if step is Step.RENEW else self._nack
                    self._start(client_id, d, act(client_id, d))

    def _start(self, client_id: str, d: Delivery, work: Any) -> None:
        slot = (client_id, d.key)
        previous = self._busy.get(slot)
        task = asyncio.create_task(self._after(previous, work))
        self._busy[slot] = task
        task.add_done_callback(lambda t: self._busy.pop(slot, None) if self._busy.get(slot) is t else None)

    async def _after(self, previous: asyncio.Task[None] | None, work: Any) -> None:
        if previous is not None:  # a renewal still running: clear with its new handle
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        await work

    def _change(self, d: Delivery, invisible_ms: int) -> Any:
        return change_invisible(self.cluster, d.group, d.topic, parse_handle(d.handle), invisible_ms,
                                Deadline(self.cluster.rpc_timeout_s))

    async def _renew(self, client_id: str, d: Delivery) -> None:
        invisible = self.rules.renew_ms(d.renew_times)
        sent = now_ms()
        try:
            handle = await self._change(d, invisible)
        except FAILURES as exc:
            if not renew_failed(d, _code(exc), self.rules):
                log.warning("gave up renewing %s of %s: %s", d.key, client_id, exc)
                self.book.discard(client_id, d)
            return
        renewed(d, handle, sent, invisible)
        log.debug("renewed %s of %s for %d ms", d.key, client_id, invisible)

    async def _nack(self, client_id: str, d: Delivery) -> None:
        self.book.discard(client_id, d)
        delay = self.cfg.invisible_time_millis_when_clear
        try:
            config = await self.cluster.group_config(d.group, d.topic)
            if config is not None:
                delay = retry_delay_ms(config.extra.get("groupRetryPolicy"), d.reconsume_times)
            await self._change(d, delay)
        except FAILURES as exc:
            log.warning("could not hand back %s of %s after renewMaxTimeMillis: %s", d.key, client_id, exc)
        else:
            log.info("stopped renewing %s of %s after renewMaxTimeMillis: visible in %d ms", d.key, client_id, delay)

    async def _clear(self, group: str, topic: str, handle: str) -> None:
        """Make a message visible after ``invisibleTimeMillisWhenClear``."""
        try:
            await change_invisible(self.cluster, group, topic, parse_handle(handle),
                                   self.cfg.invisible_time_millis_when_clear,
                                   Deadline(self.cluster.rpc_timeout_s))
        except FAILURES as exc:  # acked meanwhile, or it comes back at its invisible time
            log.debug("handing back a message of %s on %s: %s", group, topic, exc)

    async def _clear_delivery(self, d: Delivery) -> None:
        await self._clear(d.group, d.topic, d.handle)  # d.handle read after a running renewal

    async def close(self) -> None:
        """Hand back every delivery (a stopping proxy), for a few seconds at most."""
        for client_id in self.book.clients():
            for d in self.book.drop_client(client_id):
                self._start(client_id, d, self._clear_delivery(d))
        pending = [*self._busy.values(), *self._orphans]
        if pending:
            await asyncio.wait(pending, timeout=CLEAR_ON_STOP_S)
