"""The status page takes each group's master and SyncStateSet from the controllers (issue 40).

Real processes: a controller, a name server with its status page, a master that registers
with the name server only every two minutes and a slave that registers every half second.
Before the restart the caught-up slave in the SyncStateSet reads "in sync" (not the HA
link's SUSPEND).  The name server is then restarted: it knows nobody until a member
registers again, and the slave does first.  Asking the controllers
(``status_controller_addr``), the first snapshot that lists the group names its master,
the master's id and the SyncStateSet, with the master's row (not registered yet) and the
slave in sync.  The control: without the controllers the same first snapshot has no
master (what the page showed for up to a registration period)."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, free_port

from rmqha.errors import LocalClusterError

GROUP = "broker-a"


def _group(port: int) -> dict[str, Any] | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=5) as resp:
        shot = json.load(resp)
    return next((g for g in shot["groups"] if g["name"] == GROUP), None)


@pytest.mark.parametrize("ask", [True, False], ids=["controllers", "control: brokers only"])
def test_a_restarted_name_server_shows_the_master_at_once(tmp_path: Path, ask: bool) -> None:
    with Cluster(tmp_path) as c:
        c.start_controllers(1)
        port = free_port()
        extra = {"status_controller_addr": ";".join(c.controller_addresses)} if ask else {}
        # Registrations last (the test settings expire them in 5 s): the master's must hold
        # until the restart, as a real master's does between its registrations.
        ns = c.start_namesrv(status_port=port, status_poll_ms=200, broker_expire_ms=300_000, **extra)
        master = c.add_broker(GROUP, register_name_server_period_ms=120_000, namesrv_broker_timeout_ms=300_000)
        master.start()
        c.wait_broker_up(master)
        c.wait_role(master, "master", 30)
        slave = c.add_broker(GROUP)
        slave.start()
        c.wait_broker_up(slave)
        ids = sorted(b.broker_id() or 0 for b in (master, slave))
        c.wait_for(lambda: (i := c.replica_info(GROUP)) is not None and i.sync_state_set == ids, 30,
                   what="both in the SyncStateSet")
        slave_id = slave.broker_id()

        def slave_row(g: dict[str, Any] | None) -> dict[str, Any] | None:
            return next((b for b in (g or {}).get("brokers", []) if b["address"] == slave.address), None)

        try:
            row = c.wait_for(lambda: (r := slave_row(_group(port))) is not None and r["link_state"] == "in sync" and r,
                             15, what="the caught-up slave shown in sync")
        except LocalClusterError as exc:
            raise AssertionError(f"the page shows {_group(port)}") from exc
        assert row["in_sync"] is True and row["broker_id"] == slave_id

        ns.restart()
        g = c.wait_for(lambda: _group(port), 15, what="the group back on the page")
        registered = {b["address"] for b in g["brokers"] if b["registered"]}
        assert registered == {slave.address}, g  # the master has not registered again
        if not ask:
            assert g["master_address"] == "" and g["source"] == "brokers", g
            return
        assert (g["master_address"], g["master_id"], g["sync_state_set"], g["source"]) == \
            (master.address, master.broker_id(), ids, "controller"), g
        [master_row] = [b for b in g["brokers"] if b["address"] == master.address]
        assert (master_row["role"], master_row["registered"], master_row["reachable"]) == ("master", False, True)
        assert slave_row(g)["link_state"] == "in sync", g
