"""The name server's read-only status page: one HTML page and the JSON it polls.

Opt-in (``status_port``; 0 = off) and on loopback unless ``status_host`` says otherwise.
``GET /`` is a self-contained page (inline CSS and JS, nothing fetched from elsewhere, a
Content-Security-Policy that allows exactly its own script and style); its script polls
``GET /status.json`` (:meth:`ClusterView.snapshot`) every ``status_poll_ms`` and redraws.

A deliberately small HTTP/1.1 server on asyncio streams, read-only: GET only (405 with
``Allow: GET`` otherwise), two paths (404 otherwise), no request body, the request head
capped at 8 KiB and 5 s, a bounded number of connections, one response per connection.
With ``https_enable`` it is served over HTTPS with the name server's ``tls.server.*``
certificate (read at start).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import logging
import ssl
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from rmqha.errors import ConfigError

log = logging.getLogger(__name__)

#: The longest request head (request line and headers) read.
MAX_HEAD_BYTES = 8192
#: How long a client may take to send its request head.
HEAD_TIMEOUT_S = 5.0
#: Connections served at once; more are answered 503 and closed.
MAX_CONNECTIONS = 32

_STYLE = """
:root { color-scheme: light; --ink:#1d2330; --mute:#6a7284; --line:#e3e6ec; --bg:#f5f6f8;
        --ok:#1f8a4c; --warn:#b7791f; --bad:#c53030; --accent:#2b59c3; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color:var(--ink); background:var(--bg); }
header { display:flex; align-items:baseline; gap:16px; flex-wrap:wrap; padding:14px 24px;
         background:#fff; border-bottom:1px solid var(--line); }
header h1 { font-size:18px; margin:0; }
header .meta { color:var(--mute); }
#live { display:inline-block; width:9px; height:9px; border-radius:50%; background:var(--mute);
        margin-right:6px; vertical-align:middle; }
#live.ok { background:var(--ok); } #live.stale { background:var(--bad); }
main { padding:16px 24px; display:grid; gap:16px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px; padding:14px 16px; }
section h2 { font-size:16px; margin:0 0 6px; }
.facts { display:flex; flex-wrap:wrap; gap:6px 20px; margin:0 0 10px; color:var(--mute); }
.facts b { color:var(--ink); font-weight:600; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:5px 10px 5px 0; border-bottom:1px solid var(--line);
         white-space:nowrap; }
th { color:var(--mute); font-weight:600; font-size:12px; text-transform:uppercase; letter-spacing:.03em; }
td.num { text-align:right; padding-right:18px; }
.role { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:600; }
.role.master { background:#e3ecff; color:var(--accent); }
.role.slave { background:#eef1f5; color:var(--ink); }
.role.down, .role.unknown, .role.fenced { background:#fde8e8; color:var(--bad); }
.yes { color:var(--ok); font-weight:600; } .no { color:var(--warn); font-weight:600; }
.err { color:var(--bad); font-size:12px; white-space:normal; }
tr[data-role="down"] td { color:var(--mute); }
.bar { display:inline-block; width:90px; height:8px; background:var(--line); border-radius:4px;
       vertical-align:middle; margin-left:8px; overflow:hidden; }
.bar i { display:block; height:100%; background:var(--ok); }
.bar.behind i { background:var(--warn); }
.empty { color:var(--mute); }
@media (max-width: 700px) { main, header { padding-left:10px; padding-right:10px; }
  section { overflow-x:auto; } }
"""

_SCRIPT = """
"use strict";
const POLL_FALLBACK_MS = 1000;
let pollMs = POLL_FALLBACK_MS, lastOk = 0;
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, String(v));
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(k == null ? "-" : String(k)));
  return e;
}
const num = v => v == null ? "-" : Number(v).toLocaleString("en-US");
const ids = a => "{" + (a || []).join(", ") + "}";
function ago(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 60 ? s + " s ago" : s < 3600 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago";
}
function lagCell(b, g) {
  const td = el("td", {class: "num"}, b.lag_bytes == null ? "-" : num(b.lag_bytes));
  if (b.role !== "master" && g.max_offset > 0 && b.lag_bytes != null) {
    const done = Math.max(0, Math.min(1, 1 - b.lag_bytes / g.max_offset));
    const bar = el("span", {class: "bar" + (b.lag_bytes > 0 ? " behind" : ""),
                            title: (done * 100).toFixed(1) + "% of the master's log"}, el("i"));
    bar.firstChild.style.width = (done * 100).toFixed(1) + "%";
    td.append(bar);
  }
  return td;
}
function groupSection(g, now) {
  const facts = el("div", {class: "facts"},
    el("span", {}, "master ", el("b", {"data-field": "master"},
       g.master_address ? (g.master_id == null ? "" : "id " + g.master_id + " @ ") + g.master_address : "none")),
    el("span", {}, "master epoch ", el("b", {"data-field": "epoch"}, g.master_epoch)),
    el("span", {}, "from ", el("b", {"data-field": "source"}, g.source == "controller" ? "the controllers" : "the brokers")),
    el("span", {}, "SyncStateSet ", el("b", {"data-field": "sss"}, ids(g.sync_state_set)),
       " (epoch " + g.sync_state_set_epoch + ")"),
    el("span", {}, "max offset ", el("b", {}, num(g.max_offset))),
    el("span", {}, "confirm offset ", el("b", {}, num(g.confirm_offset))));
  const head = el("tr", {}, ...["Id", "Address", "Role", "Epoch", "Max offset", "Confirm offset",
    "Behind master (bytes)", "Lag (ms)", "In SyncStateSet", "Link"].map(h => el("th", {}, h)));
  const rows = g.brokers.map(b => {
    const role = b.reachable ? b.role : "down";
    const why = b.gone_since_ms != null ? "gone " + ago(now - b.gone_since_ms) + ": " + b.error : b.error;
    const insync = b.in_sync == null ? "-" : b.in_sync ? el("span", {class: "yes"}, "yes") : el("span", {class: "no"}, "no");
    return el("tr", {"data-broker": b.address, "data-role": role},
      el("td", {class: "num"}, b.broker_id == null ? "-" : b.broker_id), el("td", {}, b.address),
      el("td", {}, el("span", {class: "role " + role}, role)),
      el("td", {class: "num"}, b.master_epoch), el("td", {class: "num"}, num(b.max_offset)),
      el("td", {class: "num"}, num(b.confirm_offset)), lagCell(b, g),
      el("td", {class: "num"}, num(b.lag_ms)), el("td", {}, insync),
      el("td", {}, why ? el("span", {class: "err"}, why)
                       : (b.link_state || "-") + (b.registered ? "" : " (not registered yet)")));
  });
  return el("section", {"data-group": g.name, "data-master-epoch": g.master_epoch,
                        "data-master": g.master_address},
    el("h2", {}, g.name + " ", el("span", {class: "meta"}, "(" + g.cluster + ")")), facts,
    el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
}
function electionsSection(list, now) {
  const s = el("section", {id: "elections"}, el("h2", {}, "Recent elections"));
  if (!list.length) { s.append(el("p", {class: "empty"}, "none observed yet")); return s; }
  const head = el("tr", {}, ...["When", "Group", "Master epoch", "New master", "Previous master", "Seen via"]
    .map(h => el("th", {}, h)));
  s.append(el("table", {}, el("thead", {}, head), el("tbody", {}, ...list.map(e =>
    el("tr", {"data-election": e.group + "@" + e.epoch},
      el("td", {title: new Date(e.observed_at_ms).toISOString()},
         new Date(e.observed_at_ms).toLocaleTimeString("en-GB") + " (" + ago(now - e.observed_at_ms) + ")"),
      el("td", {}, e.group),
      el("td", {}, e.previous_epoch == null ? "first seen at " + e.epoch : e.previous_epoch + " \\u2192 " + e.epoch),
      el("td", {}, (e.master_id == null ? "" : "id " + e.master_id + " @ ") + e.master_address),
      el("td", {}, e.previous_master_address || "-"), el("td", {}, e.source))))));
  return s;
}
function render(data) {
  pollMs = data.pollMs || POLL_FALLBACK_MS;
  const now = data.nowMs;
  document.getElementById("ns").textContent = data.namesrv;
  const main = document.getElementById("main");
  const parts = data.groups.length ? data.groups.map(g => groupSection(g, now))
    : [el("section", {}, el("p", {class: "empty"}, "no broker registered"))];
  main.replaceChildren(...parts, electionsSection(data.elections, now));
  document.getElementById("updated").textContent =
    "refreshed " + new Date(data.refreshedAtMs || now).toLocaleTimeString("en-GB");
}
async function poll() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    lastOk = Date.now();
    document.getElementById("live").className = "ok";
  } catch (err) {
    document.getElementById("live").className = "stale";
    document.getElementById("updated").textContent = "name server unreachable (" + err.message + ")";
  }
  setTimeout(poll, pollMs);
}
poll();
"""

_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rmqha cluster status</title>
<style>{_STYLE}</style></head>
<body>
<header><h1>rmqha cluster status</h1>
<span class="meta">name server <span id="ns">-</span></span>
<span class="meta"><span id="live"></span><span id="updated">loading&hellip;</span></span></header>
<main id="main"><section><p class="empty">loading&hellip;</p></section></main>
<script>{_SCRIPT}</script>
</body></html>
""".encode()


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


#: Exactly the page's own inline script and style may run; it may fetch only its origin.
_CSP = (f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; "
        "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class StatusPageServer:
    """Serves the page and ``snapshot()`` as JSON on ``host:port`` (port 0: any free port)."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], dict[str, Any]],
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.host, self.port = host, port
        #: HTTPS when set.
        self.ssl_context = ssl_context
        self._snapshot = snapshot
        self._server: asyncio.Server | None = None
        self._open = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                      limit=MAX_HEAD_BYTES, ssl=self.ssl_context,
                                                      ssl_handshake_timeout=HEAD_TIMEOUT_S
                                                      if self.ssl_context else None)
        except OSError as exc:
            raise ConfigError(f"status_port: cannot listen on {self.host}:{self.port}: "
                              f"{exc.strerror or exc}") from exc
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("status page on %s://%s:%d/", "https" if self.ssl_context else "http",
                 self.host, self.port)
        if not _is_loopback(self.host):
            log.warning("status page bound to %s: reachable from other hosts, and it has no login "
                        "(it is read-only; put it behind something that authenticates)", self.host)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > MAX_CONNECTIONS:
                await self._respond(writer, HTTPStatus.SERVICE_UNAVAILABLE, b"too many connections\n")
                return
            status, body, ctype, extra = await self._answer(reader)
            await self._respond(writer, status, body, ctype, extra)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        finally:
            self._open -= 1
            writer.close()
            try:
                await writer.wait_closed()
            except ConnectionError:
                pass  # already reset by the peer

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[HTTPStatus, bytes, str, dict[str, str]]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return _text(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes")
        except asyncio.TimeoutError:
            return _text(HTTPStatus.REQUEST_TIMEOUT, "request head not received in time")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _text(HTTPStatus.BAD_REQUEST, "expected an HTTP/1.x request line")
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    return _text(HTTPStatus.BAD_REQUEST, f"malformed header line {line[:60]!r}")
                headers[name.strip().lower()] = value.strip()
        if method != "GET":
            status, body, ctype, _ = _text(HTTPStatus.METHOD_NOT_ALLOWED, f"{method[:20]} not allowed: this page is read-only")
            return status, body, ctype, {"Allow": "GET"}
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            return _text(HTTPStatus.BAD_REQUEST, "a GET takes no body")
        path = target.split("?", 1)[0]
        if path in ("/", "/index.html"):
            return HTTPStatus.OK, _PAGE, "text/html; charset=utf-8", {}
        if path == "/status.json":
            body = json.dumps(self._snapshot(), sort_keys=True, separators=(",", ":")).encode()
            return HTTPStatus.OK, body, "application/json", {}
        return _text(HTTPStatus.NOT_FOUND, f"no such page {path[:100]!r}: try / or /status.json")

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: HTTPStatus, body: bytes,
                       ctype: str = "text/plain; charset=utf-8", extra: dict[str, str] | None = None) -> None:
        headers = {
            "Content-Type": ctype, "Content-Length": str(len(body)), "Connection": "close",
            "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Content-Security-Policy": _CSP, **(extra or {}),
        }
        head = f"HTTP/1.1 {status.value} {status.phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(head.encode("latin-1") + b"\r\n" + body)
        await writer.drain()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _text(status: HTTPStatus, message: str) -> tuple[HTTPStatus, bytes, str, dict[str, str]]:
    return status, (message + "\n").encode(), "text/plain; charset=utf-8", {}
