"""The network layer under client, broker, name server and controller.

- :mod:`~rmqha.net.connection`: :class:`Connection` (one TCP connection of remoting frames,
  either direction) and its :class:`Dispatcher`;
- :mod:`~rmqha.net.server`: :class:`RemotingServer`;
- :mod:`~rmqha.net.client`: :class:`RemotingClient` and :func:`split_address`;
- :mod:`~rmqha.net.blocking`: :class:`BlockingRemotingClient`;
- :mod:`~rmqha.net.loop`: which event loop runs everything, and :class:`EventLoopThread`.

It imports :mod:`rmqha.protocol` and :mod:`rmqha.errors` only.
"""
