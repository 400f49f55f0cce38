"""``rmqha proxy``: the gRPC access point of RocketMQ 5's clients (``apache.rocketmq.v2``).

A stateless process between RocketMQ 5's official clients and an rmqha cluster, as
RocketMQ's cluster-mode proxy: clients speak gRPC (``MessagingService``) to it, it finds
masters through the name servers and speaks remoting to the brokers.  Rules without I/O
live in their own modules (:mod:`.status`, :mod:`.validation`, :mod:`.sends`,
:mod:`.deliveries`, :mod:`.settings`, :mod:`.routing`, :mod:`.handles`, :mod:`.auth`);
the I/O is in :mod:`.cluster` (brokers and name servers), :mod:`.producing`,
:mod:`.consuming`, :mod:`.client_activity`, :mod:`.transactions`; :mod:`.service` is the
gRPC glue and :mod:`.server` the process.  Needs the ``proxy`` extra.
"""
