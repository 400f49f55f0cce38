"""How a consumer may filter: CHECK_CLIENT_CONFIG (46).

A Java consumer sends it for a subscription that is not a tag expression: rmqha filters by
tag only, so SQL92 gets RocketMQ's own answer for a broker with property filtering off
(SYSTEM_ERROR, "does not support ... SQL92"); a tag subscription is accepted.  (The
server-side assignment codes, QUERY_ASSIGNMENT and SET_MESSAGE_REQUEST_MODE, are
:mod:`rmqha.messaging.queue_assignment`'s.)
"""
from __future__ import annotations

import json
from typing import Any

from rmqha.net.peer import RequestPeer
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
    """CHECK_CLIENT_CONFIG."""

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.CHECK_CLIENT_CONFIG: self.on_check_client_config,
        }

    async def on_check_client_config(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
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
