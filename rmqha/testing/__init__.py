"""Harnesses for tests, benchmarks and the demo; product code never imports this package.

- :mod:`~rmqha.testing.local_cluster`: real controller, name server and broker processes
  on loopback (:class:`Cluster`, free ports, log capture, cleanup of strays);
- :mod:`~rmqha.testing.controllers`: a controller group addressed by node index;
- :mod:`~rmqha.testing.ha`: in-process HA masters and slaves over real sockets, and the
  helpers that fill, wait and compare their stores.
"""
