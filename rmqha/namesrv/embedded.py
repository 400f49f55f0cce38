"""A controller hosted in the name server process (``enable_controller_in_namesrv``).

RocketMQ can embed its DLedger controller in the NameServer; the controller then listens
on its own peer port, not the name server's.  Here the name server builds a
:class:`rmqha.controller.config.ControllerConfig` from ``controller_config_file`` and/or
the ``[controller]`` table of its own config and runs a
:class:`rmqha.controller.server.ControllerServer` on the same event loop.  A controller
configured without a cluster secret takes the name server's (and its ``allow_insecure``).
"""
from __future__ import annotations

import logging

from rmqha.config import load_config
from rmqha.controller.config import ControllerConfig
from rmqha.controller.server import ControllerServer
from rmqha.metrics import MetricsRegistry
from rmqha.namesrv.config import NamesrvConfig

log = logging.getLogger(__name__)


async def start_embedded_controller(config: NamesrvConfig,
                                    metrics: MetricsRegistry | None = None) -> ControllerServer:
    """Load the controller settings and start a controller node; returns it (call stop()).

    With ``metrics`` (the name server's registry) the controller's series are served on
    the name server's metrics port too.
    """
    ccfg = load_config(
        ControllerConfig,
        config.controller_config_file or None,
        overrides=dict(config.controller) or None,
    )
    if ccfg.secret() is None:
        # One secret per cluster: the name server's, unless the controller names its own.
        ccfg.cluster_secret = config.secret()
        ccfg.allow_insecure = ccfg.allow_insecure or config.allow_insecure
    server = ControllerServer(ccfg, metrics)
    await server.start()
    log.info("embedded controller %s serving %s", ccfg.controller_self_id, server.address)
    return server
