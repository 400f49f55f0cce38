"""RocketMQ's wire protocol, shared by client, broker, name server and controller.

- :mod:`~rmqha.protocol.codes`: request and response codes;
- :mod:`~rmqha.protocol.version`: RocketMQ's ``MQVersion`` ordinals;
- :mod:`~rmqha.protocol.command`: :class:`RemotingCommand` and its codec.

It imports only :mod:`rmqha._core` and :mod:`rmqha.errors`.
"""
