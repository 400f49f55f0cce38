"""The name server: broker registration, the route table, routes for clients.

:class:`rmqha.namesrv.server.NameServer` is the process object; the route logic lives in
:mod:`rmqha.namesrv.route_table`.  It can host a controller in the same process
(``enable_controller_in_namesrv``).
"""
