"""The controllers' Raft timings a broker's master lease is computed against.

A master holds its lease for ``controller_heartbeat_timeout_ms - margin``; the margin must
cover a controller leader cut off from its quorum that still answers heartbeats until it
steps down: ``LEADER_FALLBACK_TIMEOUT_S`` (1.5 s) checked once per ``RAFT_TICK_S`` (50 ms),
1.55 s in all (:mod:`rmqha.broker.master_lease`). Both sides read them here: the
controller runs pysyncobj with them (:mod:`rmqha.controller.raft`), and the broker sizes
its lease by them without importing the controller's Raft (and pysyncobj with it).
"""
from __future__ import annotations

#: A leader without a majority's answers for this long steps down (pysyncobj
#: ``leaderFallbackTimeout``); the master lease's margin covers it.
LEADER_FALLBACK_TIMEOUT_S = 1.5
#: pysyncobj's tick (``autoTickPeriod``): the fallback is checked once a tick.
RAFT_TICK_S = 0.05
