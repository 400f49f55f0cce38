"""The demos: :mod:`rmqha.demo.cluster` (``rmqha demo``, a cluster losing its master under
load) and :mod:`rmqha.demo.store` (``rmqha demo-store``, the commitlog alone).

The ``rmqha`` subcommands that run them are in :mod:`rmqha.cli.demo`.
"""
