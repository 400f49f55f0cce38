"""Authentication and authorisation building blocks, sans-I/O where they can be.

Nothing here opens a port or owns a connection: servers and links call these pieces.

Modules and what each owns:

- ``identity``: :class:`Identity` (role + names, text ``rmqha:<role>/...``) and
  ``authorize`` (is this peer allowed here?); shared by ``tls`` and ``link_auth``.
- ``secret``: the cluster secret (config / ``RMQHA_CLUSTER_SECRET`` / file), kept out of
  logs; ``constant_time_equals``.
- ``secret_policy``: where a process's secret comes from, and when a controller, name
  server or broker may run without one (loopback, ``allow_insecure``).
- ``signature``: RocketMQ ACL 1.0 request signatures (HMAC-SHA1), checking and signing.
- ``address_pattern``: RocketMQ's remote-address patterns (``192.168.*.*``, ``{1,2}``, ...).
- ``acl``: ``plain_acl.yml`` (reloaded when it changes), the resources and permissions a
  request names (as its code's declaration in ``rmqha.protocol.code_rules`` says), and
  ``AclValidator.check`` (raises ``rmqha.errors.AclError``).
- ``link_auth``: shared-secret mutual handshake for internal links without TLS, then a MAC
  on every frame (``Handshake``, ``LinkSession.seal`` / ``open``).
- ``channel_auth``: that handshake and MAC on a remoting connection (``ChannelEndpoint``,
  ``ChannelKey``), and ``channel_refusal`` (who may send a state-changing request).
- ``certs``: the cluster CA and per-process certificates naming their identity (used by
  ``rmqha certs``).
- ``tls``: ``ssl.SSLContext`` builders from RocketMQ's ``tls.*`` keys, reload on file
  change, one-port TLS/plaintext by first byte, and the peer's identity from its certificate.

Imports allowed in this package: the standard library, ``cryptography``, ``yaml``
(PyYAML, imported lazily by ``acl`` only), ``rmqha.errors`` and ``rmqha.protocol`` (the
layer below: the request codes and their declarations, never copied here), plus its own
modules.
"""
