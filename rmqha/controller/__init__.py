"""The controller group: Raft-replicated broker metadata, elections and liveness.

Modules: ``config`` (ControllerConfig), ``state`` (the replicated state machine and its
events), ``logic`` (request validation against committed state), ``elect_policy``
(candidate ranking), ``heartbeat`` (leader-side liveness), ``metrics``, ``server`` (the
controller process) and ``client`` (ControllerClient for brokers and the CLI).
"""
