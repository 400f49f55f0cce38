"""The broker process: identity, roles (ReplicasManager), HA and messaging wiring.

``rmqha.broker.Broker(config)`` is the process object (:mod:`rmqha.broker.broker`);
``BrokerConfig`` its settings (:mod:`rmqha.broker.config`).
"""
from rmqha.broker.broker import Broker, run_broker
from rmqha.broker.config import BrokerConfig, load_broker_config

__all__ = ["Broker", "BrokerConfig", "load_broker_config", "run_broker"]
