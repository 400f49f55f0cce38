"""How a consumer may consume: filter support and broker-side assignment.

A Java consumer asks before it starts and while it rebalances:

* CHECK_CLIENT_CONFIG (46), sent for a subscription that is not a tag expression: rmqha
  filters by tag only, so SQL92 gets RocketMQ's own answer for a broker with property
  filtering off (SYSTEM_ERROR, "does not support ... SQL92"); a tag subscription is
  accepted.
* QUERY_ASSIGNMENT (400), sent only by a push consumer with ``clientRebalance = false``
  (pop consumption): rmqha rebalances on the client only and answers
  REQUEST_CODE_NOT_SUPPORTED naming that, so the client logs why it got no queues.
* SET_MESSAGE_REQUEST_MODE (401), an admin request: PULL is accepted; POP (a push
  consumer switched to pop by the broker's queue assignment) is refused with
  REQUEST_CODE_NOT_SUPPORTED.  POP_MESSAGE itself is served (:mod:`rmqha.messaging.pop_path`)
  to clients that pick their queues themselves: RocketMQ 5's proxy, or a pop with
  ``queueId=-1``.
"""
from __future__ import annotations

import json
from typing import Any

from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.messaging.context import Handler
from rmqha.protocol.command import RemotingCommand

#: ExpressionType values a Java client sends; rmqha evaluates TAG only.
TAG_EXPRESSION = "TAG"


def _json_body(cmd: RemotingCommand) -> dict[str, Any] | None:
    try:
        body = json.loads(cmd.body or b"{}")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class ConsumerModes:
    """CHECK_CLIENT_CONFIG, QUERY_ASSIGNMENT, SET_MESSAGE_REQUEST_MODE."""

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.CHECK_CLIENT_CONFIG: self.on_check_client_config,
            rc.QUERY_ASSIGNMENT: self.on_query_assignment,
            rc.SET_MESSAGE_REQUEST_MODE: self.on_set_request_mode,
        }

    async def on_check_client_config(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        body = _json_body(cmd)
        if body is None:
            return cmd.response(ResponseCode.INVALID_PARAMETER,
                                "CHECK_CLIENT_CONFIG body is not a JSON object")
        sub = body.get("subscriptionData")
        if not isinstance(sub, dict):
            return cmd.response(ResponseCode.SUCCESS, None, {})
        kind = str(sub.get("expressionType") or TAG_EXPRESSION)
        if kind.upper() != TAG_EXPRESSION:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                f"The broker does not support consumer to filter message by {kind}")
        return cmd.response(ResponseCode.SUCCESS, None, {})

    async def on_query_assignment(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        return cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            "QUERY_ASSIGNMENT: rmqha assigns queues on the client only; use a consumer with "
            "clientRebalance=true (the default) and PULL mode")

    async def on_set_request_mode(self, cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        body = _json_body(cmd)
        if body is None:
            return cmd.response(ResponseCode.INVALID_PARAMETER,
                                "SET_MESSAGE_REQUEST_MODE body is not a JSON object")
        mode = str(body.get("mode") or "PULL").upper()
        if mode == "PULL":
            return cmd.response(ResponseCode.SUCCESS, None, {})
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                            f"message request mode {mode} is not supported: rmqha does not "
                            f"assign queues to pop consumers (QUERY_ASSIGNMENT); POP_MESSAGE "
                            f"with queueId -1 pops from every queue")
