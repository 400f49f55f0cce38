"""The chaos suite with security on: mutual TLS on every remoting port and ACL on the brokers.

``RMQHA_CHAOS_SECURITY`` picks the mode of every chaos run (``make chaos`` sets
``tls-acl``; unset, the runs have the cluster secret only, as in ``make test``):

- ``tls-acl``: a CA and a certificate per process made with ``rmqha certs dev-cluster``'s
  code (what an operator runs); every controller, name server and broker port
  ``tls.server.mode=enforcing`` with ``tls.server.need.client.auth=require`` and its own
  links over TLS with its certificate, so each control request is checked against the
  identity its certificate names; every broker ``aclEnable`` with a ``plain_acl.yml``
  holding one application account (the producers and the tailing consumer: PUB and SUB
  on the checked topic, SUB for the consumer group, nothing else) and one admin account
  (the harness's probes and status samples, over the admin certificate).  The files and
  settings are :mod:`rmqha.testing.secure_setup`'s.

The cluster secret stays on in both modes (control requests carry its proof too).
"""
from __future__ import annotations

import os
from pathlib import Path

from rmqha.testing.secure_setup import Account, SecureSetup

ENV = "RMQHA_CHAOS_SECURITY"
MODES = ("", "tls-acl")
APP_KEY = "chaos-app"
ADMIN_KEY = "chaos-admin"


def mode() -> str:
    """The mode asked for (ValueError naming the allowed ones for anything else)."""
    value = os.environ.get(ENV, "").strip()
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(repr(m) for m in MODES)}")
    return value


def secure_cluster(directory: Path, *, cluster: str, group: str, brokers: int, controllers: int,
                   topic: str, consumer_group: str) -> SecureSetup:
    """Certificates for every process of one run and its two accounts."""
    app = Account.new(APP_KEY, topics={topic: "PUB|SUB"}, groups=[consumer_group])
    return SecureSetup.make(directory, cluster=cluster, groups={group: brokers}, app=app,
                            controllers=controllers, admin_key=ADMIN_KEY)
