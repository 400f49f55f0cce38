"""A broker's answers to mqadmin about itself: clusterList / brokerStatus, getBrokerConfig and
updateBrokerConfig.

- GET_BROKER_RUNTIME_INFO (28) answers RocketMQ's ``KVTable`` with the keys mqadmin reads
  (``brokerActive``, ``brokerVersionDesc``, ``putTps``, ``getTransferredTps``, the timer and
  thread-pool figures, ``earliestMessageTimeStamp``, ``commitLogDiskRatio``, ...).  rmqha has
  no thread pools or timer wheel: those keys are 0, as an idle RocketMQ broker reports them;
  ``brokerActive`` is true on the master (RocketMQ's "special services" run there).
- GET_BROKER_CONFIG (26) answers the broker's configuration as a Java properties text under
  RocketMQ's camelCase names (secrets shown as ``******``), with RocketMQ's ``version``
  header field (a ``DataVersion``).
- UPDATE_BROKER_CONFIG (25) is refused, changing nothing: a broker's configuration is its
  file (and ``RMQHA_*`` variables), read at start, and one broker of a replicated group
  changed alone at run time would differ from the others after a failover.  The remark
  says so.
"""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from typing import Any

from rmqha import __version__
from rmqha.config import to_dict
from rmqha.errors import StoreError
from rmqha.messaging.service import MessageService
from rmqha.net.peer import RequestPeer
from rmqha.protocol.admin_bodies import kv_table_body, properties_text
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.version import ADVERTISED
from rmqha.store import CommitLog

#: Config values never shown by GET_BROKER_CONFIG.
SECRET_KEYS = frozenset({"clusterSecret", "adminToken", "tlsServerKeyPassword", "tlsClientKeyPassword"})
#: What UPDATE_BROKER_CONFIG answers.
UPDATE_REFUSED = ("rmqha brokers take no configuration changes at run time: a broker's configuration is its "
                  "config file (and RMQHA_* variables), read at start; change it there and restart the "
                  "broker (one replica at a time). Nothing was changed.")


class BrokerAdminInfo:
    """Answers the three codes for one broker; ``snapshot`` gives what changes at run time."""

    def __init__(self, config: Any, *, is_master: Callable[[], bool], earliest_store_time: Callable[[], int],
                 store_dir: str) -> None:
        self.config = config
        self.is_master = is_master
        self.earliest_store_time = earliest_store_time
        self.store_dir = store_dir
        self.started_ms = int(time.time() * 1000)

    #: What it answers (the broker process serves them itself, beside its messaging service).
    CODES = (RequestCode.GET_BROKER_RUNTIME_INFO, RequestCode.GET_BROKER_CONFIG, RequestCode.UPDATE_BROKER_CONFIG)

    def handlers(self) -> dict[int, Any]:
        return dict(zip(self.CODES, (self.on_runtime_info, self.on_get_config, self.on_update_config)))

    def runtime_info(self) -> dict[str, str]:
        usage = shutil.disk_usage(self.store_dir)
        zero = {key: "0" for key in (
            "msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning", "msgPutTotalTodayNow",
            "msgGetTotalYesterdayMorning", "msgGetTotalTodayMorning", "msgGetTotalTodayNow",
            "dispatchBehindBytes", "pageCacheLockTimeMills", "timerReadBehind", "timerOffsetBehind",
            "timerCongestNum", "sendThreadPoolQueueSize", "pullThreadPoolQueueSize",
            "litePullThreadPoolQueueSize", "queryThreadPoolQueueSize", "ackThreadPoolQueueSize",
            "sendThreadPoolQueueHeadWaitTimeMills", "pullThreadPoolQueueHeadWaitTimeMills",
            "queryThreadPoolQueueHeadWaitTimeMills", "litePullThreadPoolQueueHeadWaitTimeMills",
            "ackThreadPoolQueueHeadWaitTimeMills", "EndTransactionQueueSize", "remainTransientStoreBufferNumbs")}
        earliest = self.earliest_store_time()
        return {
            **zero,
            "brokerActive": "true" if self.is_master() else "false",
            "brokerVersionDesc": f"rmqha {__version__} ({ADVERTISED.name})",
            "putTps": "0.0 0.0 0.0", "getTransferredTps": "0.0 0.0 0.0",
            "timerEnqueueTps": "0.0", "timerDequeueTps": "0.0",
            "earliestMessageTimeStamp": str(earliest) if earliest > 0 else "",
            "startAcceptSendRequestTimeStamp": "0",
            "commitLogDiskRatio": f"{(usage.total - usage.free) / usage.total:.4f}" if usage.total else "0",
            "commitLogDirCapacity": f"Total : {_human(usage.total)}, Free : {_human(usage.free)}.",
            "remainHowManyDataToFlush": "0 B",
        }

    async def on_runtime_info(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, {}, kv_table_body(self.runtime_info()))

    def config_view(self) -> dict[str, Any]:
        view = to_dict(self.config)
        for key in SECRET_KEYS:
            if view.get(key):
                view[key] = "******"
        return view

    async def on_get_config(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        version = {"counter": 0, "stateVersion": 0, "timestamp": self.started_ms}
        return cmd.response(ResponseCode.SUCCESS, None, {"version": json.dumps(version, separators=(",", ":"))},
                            properties_text(self.config_view()))

    async def on_update_config(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        return cmd.response(ResponseCode.SYSTEM_ERROR, UPDATE_REFUSED)


def _human(size: int) -> str:
    """``MixAll.humanReadableByteCount(size, false)``: binary units, one decimal."""
    if size < 1024:
        return f"{size} B"
    units, value = "KMGTPE", float(size)
    for unit in units:
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}iB"
    return f"{value:.1f} EiB"


def earliest_store_time(service: MessageService | None, commitlog: CommitLog | None) -> int:
    """The store time of the oldest record kept (0 for an empty log): brokerStatus's
    ``earliestMessageTimeStamp``."""
    if service is None or commitlog is None or commitlog.max_offset <= commitlog.min_offset:
        return 0
    try:
        return service.ctx.store_timestamp(commitlog.min_offset)
    except (StoreError, ValueError, OSError):
        return 0
