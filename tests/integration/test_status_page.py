"""The name server's status page, in a real headless Chromium, across a real failover.

- the HTTP side: ``/`` is one self-contained page (no external URL, a CSP allowing only
  its own inline script and style), ``/status.json`` the data, 404/405/400/431 for the
  rest, bound to loopback;
- in Chromium (Debian's ``chromium``, ``make test`` installs it when missing): the page's
  script fetches the JSON and draws the group, its master, epoch and SyncStateSet, and
  each broker's offsets and lag (the served HTML holds none of it: only the script can);
- after SIGKILL of the master and the controller's election, a new page load shows the
  new master, the new epoch, and the election (old and new epoch, time) in "Recent
  elections"; a screenshot is a valid PNG of the window's size;
- the view alone: one election per new master epoch (never for a lower one), brokers that
  leave the routes listed as down for a while, then forgotten.
"""
from __future__ import annotations

import asyncio
import calendar
import html
import json
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cluster import Cluster, free_port
from rmqha.cli import main as rmqha_cli
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.namesrv.cluster_view import GONE_KEPT_MS, ClusterView
from rmqha.namesrv.route_table import BrokerRegistration, RouteTable

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WINDOW = (1280, 860)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("status"), cluster_name="status-cluster") as c:
        c.start_controllers(1)
        c.status_port = free_port()
        c.start_namesrv(status_port=c.status_port, status_poll_ms=250)
        c.a, c.b = c.start_group("broker-a", 2, in_sync=True)
        ns = c.namesrvs[0].address
        assert rmqha_cli(["update-topic", "-n", ns, "-t", "StatusTopic", "-r", "2"]) == 0
        assert rmqha_cli(["send", "-n", ns, "-t", "StatusTopic", *(f"m{i}" for i in range(20))]) == 0
        yield c


def _url(live, path: str = "/") -> str:
    return f"http://127.0.0.1:{live.status_port}{path}"


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _raw(live, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", live.status_port), timeout=5) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _snapshot(live) -> dict:
    status, _, body = _get(_url(live, "/status.json"))
    assert status == 200
    return json.loads(body)


def _chromium(*args: str) -> str:
    """One headless Chromium run; its stdout.  ``--virtual-time-budget`` lets the page's
    fetch and redraw happen before the DOM is dumped or the screenshot taken."""
    assert CHROMIUM is not None, "chromium is not on PATH: `make browser` installs it (Debian's package)"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=3000", *args],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _dom(live) -> str:
    return _chromium("--dump-dom", _url(live))


def _text(dom: str) -> str:
    """The visible text of a DOM dump, tags dropped, whitespace collapsed."""
    no_code = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", no_code)).split())


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR" and data[-8:-4] == b"IEND", "PNG without header or end chunk"
    return struct.unpack(">II", data[16:24])


def test_http_answers_only_what_it_serves(live) -> None:
    status, headers, body = _get(_url(live))
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    # Self-contained: nothing loaded from anywhere (no src=, href= or url() at all).
    assert not re.search(r"\b(src|href)\s*=|url\(|@import", page)
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "unsafe" not in csp
    # The data comes only from the script's poll: the served page names no broker.
    assert live.a.address not in page and "broker-a" not in page
    snap = _snapshot(live)
    assert [g["name"] for g in snap["groups"]] == ["broker-a"]
    assert _get(_url(live, "/nope"))[0] == 404
    assert _get(_url(live, "/status.json?x=1"))[0] == 200
    assert _raw(live, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").startswith(
        b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"\r\nAllow: GET\r\n" in _raw(live, b"DELETE /status.json HTTP/1.1\r\n\r\n")
    assert _raw(live, b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").startswith(b"HTTP/1.1 400 ")
    assert _raw(live, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    huge = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 10_000 + b"\r\n\r\n"
    assert _raw(live, huge).startswith(b"HTTP/1.1 431 ")
    # Loopback by default: the kernel's table has the port listening on 127.0.0.1 only.
    assert _listening_on(live.status_port) == ["127.0.0.1"]


def _listening_on(port: int) -> list[str]:
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        ip_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
            found.append(socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16))))
    if any(ln.split()[3] == "0A" and int(ln.split()[1].split(":")[1], 16) == port
           for ln in Path("/proc/net/tcp6").read_text().splitlines()[1:]):
        found.append("::")
    return found


def test_page_in_chromium_follows_a_failover(live, tmp_path: Path) -> None:
    c = live
    before = c.replica_info("broker-a")
    assert before is not None and before.master_id is not None
    old_master = c.a if c.a.broker_id() == before.master_id else c.b
    new_master = c.b if old_master is c.a else c.a
    # The master's log end as the master itself tells it now (the page's data is a poll
    # behind: a poll from before the fixture's sends can look settled at a smaller offset).
    resp = c.request(old_master.address, RequestCode.GET_BROKER_HA_STATUS)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    log_end = int(resp.json_body()["maxOffset"])

    # Wait until the page's data has both brokers with their offsets.
    def settled() -> bool:
        groups = _snapshot(c)["groups"]
        if len(groups) != 1 or len(groups[0]["brokers"]) != 2:
            return False
        g = groups[0]
        return (g["sync_state_set"] == sorted([c.a.broker_id(), c.b.broker_id()])
                and g["max_offset"] == log_end
                and g["confirm_offset"] == g["max_offset"] and g["brokers"][1]["lag_bytes"] == 0)

    c.wait_for(settled, what="the status data to show both brokers in sync, every message confirmed")
    max_offset = _snapshot(c)["groups"][0]["max_offset"]

    shot_before = tmp_path / "before.png"
    text = _text(_chromium(f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot_before}",
                           "--dump-dom", _url(c)))
    assert _png_size(shot_before) == WINDOW
    assert "broker-a (status-cluster)" in text
    assert f"master id {before.master_id} @ {old_master.address}" in text
    assert f"master epoch {before.master_epoch}" in text
    ids = sorted([c.a.broker_id(), c.b.broker_id()])
    assert f"SyncStateSet {{{ids[0]}, {ids[1]}}}" in text
    assert f"max offset {max_offset:,}" in text
    # Per broker: id, address, role, epoch, max offset, confirm offset, bytes behind, lag ms, in set.
    assert (f"{before.master_id} {old_master.address} master {before.master_epoch} {max_offset:,} "
            f"{max_offset:,} 0 0 yes serving") in text
    assert f"{new_master.broker_id()} {new_master.address} slave {before.master_epoch} {max_offset:,}" in text
    assert f"first seen at {before.master_epoch}" in text

    killed_at = time.time()
    old_master.kill()
    after = c.wait_for(lambda: (i := c.replica_info("broker-a")) is not None
                       and i.master_epoch > before.master_epoch and i.master_id == new_master.broker_id() and i,
                       timeout=30, what="the controller to elect the other broker")
    c.wait_for(lambda: (s := _snapshot(c))["groups"] and s["groups"][0]["master_epoch"] == after.master_epoch
               and s["elections"] and s["elections"][0]["epoch"] == after.master_epoch,
               what="the status data to see the new master")

    shot = tmp_path / "status.png"
    dom = _chromium(f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", "--dump-dom", _url(c))
    text = _text(dom)
    assert f"master id {after.master_id} @ {new_master.address}" in text
    assert f"master epoch {after.master_epoch}" in text
    assert f"{new_master.address} master" in text
    assert f"{old_master.address} down" in text and "left the name server's routes" in text
    # The election: old epoch -> new epoch, the new master, the old one, seen after the kill.
    m = re.search(r'<tr data-election="broker-a@(\d+)"><td title="([^"]+)">', dom)
    assert m and int(m.group(1)) == after.master_epoch, dom[-3000:]
    assert f"{before.master_epoch} \u2192 {after.master_epoch}" in text
    row = text[text.index(f"{before.master_epoch} \u2192 {after.master_epoch}"):]
    assert row.split()[3:6] == ["id", str(after.master_id), "@"] and new_master.address in row
    assert old_master.address in row.split("first seen")[0]
    seen = calendar.timegm(time.strptime(m.group(2)[:19], "%Y-%m-%dT%H:%M:%S"))
    assert killed_at - 2 <= seen <= time.time() + 1
    assert _png_size(shot) == WINDOW
    assert shot.stat().st_size > 10_000  # a drawn page, not a blank one


def test_view_records_each_new_master_epoch_once_and_keeps_departed_brokers_for_a_while() -> None:
    now = [1_000_000]
    routes = RouteTable()
    view = ClusterView(routes, poll_ms=500, request_timeout_s=0.5, clock=lambda: now[0])
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]  # nothing listens there

    def reg(addr: str, broker_id: int, epoch: int) -> BrokerRegistration:
        r = BrokerRegistration(cluster="c", broker_name="g", broker_addr=addr, broker_id=broker_id,
                               master_epoch=epoch)
        assert routes.register(r, 0).accepted
        view.observe_registration(r)
        return r

    reg(dead[0], 0, 1)
    reg(dead[1], 2, 1)
    reg(dead[0], 0, 1)  # a renewal: no new election
    now[0] += 1000
    reg(dead[1], 0, 2)  # the other broker registers as master at epoch 2
    # A lower epoch (the routes refuse it anyway) is never an election.
    view.observe_registration(BrokerRegistration(cluster="c", broker_name="g", broker_addr=dead[0],
                                                 broker_id=0, master_epoch=1))
    assert [(e.epoch, e.previous_epoch, e.master_address, e.previous_master_address, e.observed_at_ms)
            for e in view.elections] == [(2, 1, dead[1], dead[0], 1_001_000), (1, None, dead[0], None, 1_000_000)]

    async def scenario() -> list[dict]:
        shots = []
        await view.refresh()
        shots.append(view.snapshot("ns"))
        routes.unregister("g", dead[1])
        now[0] += 1000
        await view.refresh()
        shots.append(view.snapshot("ns"))
        now[0] += GONE_KEPT_MS + 1
        await view.refresh()
        shots.append(view.snapshot("ns"))
        await view.stop()
        return shots

    first, gone, forgotten = asyncio.run(scenario())
    (g,) = first["groups"]
    # Unreachable brokers are listed as down with the reason; the master as registered.
    assert g["master_address"] == dead[1] and g["master_epoch"] == 2
    assert {b["address"]: (b["reachable"], b["role"]) for b in g["brokers"]} == {dead[1]: (False, "unknown")}
    assert "cannot connect" in g["brokers"][0]["error"]
    (g,) = gone["groups"]  # the group's last broker left: still shown, as down, with when
    assert [(b["address"], b["role"], b["gone_since_ms"]) for b in g["brokers"]] == [(dead[1], "down", 1_001_000)]
    assert forgotten["groups"] == []
    assert [e["epoch"] for e in forgotten["elections"]] == [2, 1]
