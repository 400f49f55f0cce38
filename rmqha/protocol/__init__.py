"""RocketMQ's wire protocol, shared by client, broker, name server and controller.

- :mod:`~rmqha.protocol.codes`: request and response codes;
- :mod:`~rmqha.protocol.version`: RocketMQ's ``MQVersion`` ordinals;
- :mod:`~rmqha.protocol.command`: :class:`RemotingCommand` and its codec;
- :mod:`~rmqha.protocol.headers`: request header classes (build and parse);
- :mod:`~rmqha.protocol.message`: the message codec (properties, sysflags, ids, batch
  bodies, record decode);
- :mod:`~rmqha.protocol.topics`: topic names, permissions and topic configs.

It imports only :mod:`rmqha._core` and :mod:`rmqha.errors`.
"""
