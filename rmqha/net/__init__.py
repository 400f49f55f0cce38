"""The network layer under client, broker, name server and controller.

- :mod:`~rmqha.net.connection`: :class:`Connection` (one TCP connection of remoting frames,
  either direction) and its :class:`Dispatcher`;
- :mod:`~rmqha.net.server`: :class:`RemotingServer`;
- :mod:`~rmqha.net.client`: :class:`RemotingClient` and :func:`split_address`;
- :mod:`~rmqha.net.blocking`: :class:`BlockingRemotingClient`;
- :mod:`~rmqha.net.client_security`: :class:`ClientSecurity` (a client's TLS, its
  authenticated channel and its request hook) and :class:`Credentials` (RocketMQ ACL 1.0
  signing);
- :mod:`~rmqha.net.channel`: authenticated channels (the cluster secret's handshake, then
  a MAC on every frame) as a connection's frame layer;
- :mod:`~rmqha.net.loop`: which event loop runs everything, and :class:`EventLoopThread`.

It imports :mod:`rmqha.protocol`, :mod:`rmqha.security` and :mod:`rmqha.errors` only.
"""
