"""``rmqha demo --grpc``: the demo's load through ``rmqha proxy`` with RocketMQ 5's official
Python client (``rocketmq-python-client``).

The scenario is :class:`rmqha.demo.cluster.Demo`'s (a cluster of 3 controllers and a broker
group of 3, the master SIGKILLed under load, the old master back as a slave, the
acknowledged messages counted); :class:`GrpcDemo` adds one proxy process and swaps the
clients.  :class:`GrpcProduceLoad` sends the numbered messages with the client's Producer,
one message per send (the client has no batches), ``in_flight`` sends outstanding; a
:class:`GrpcReceiver` receives and acks them with a SimpleConsumer on a thread of its own,
from before the first send, through the kill, to the end.  Both clients know only the
proxy's address: their routes name the proxy, so the failover needs no route refresh on
their side (the proxy finds the new master).  A send the client gave up on (its own three
attempts) is sent again by the demo, as a new message with the same sequence number,
until a deadline: a repeat of a send that was stored after all shows as a duplicate.

Secured (the default, see :mod:`rmqha.demo.cluster`) the proxy is a process of the secured
cluster: its own certificate (``rmqha:client/proxy``, issued in the demo's ``pki/`` as
``rmqha certs issue`` does) on its links to the name server and the brokers, which run
mutual TLS, and on its gRPC port, ``enforcing`` TLS; it checks every call's signature
against the brokers' ``plain_acl.yml`` (``aclEnable``) and signs its own broker requests
as the demo's account (``inner_access_key``).  The official client goes over TLS
(``tls_enable``; it checks the proxy's certificate against the demo's CA, named by
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` in this process: the client takes no other trust
setting) and signs every call with the demo's account.  It presents no certificate (it
has no setting for one), so that one port asks for none: the account is what it proves.

The client cannot share a venv with the dev extra (both install a top-level ``rocketmq``):
:func:`client_missing` says so before anything starts, naming ``make demo-grpc``, which
makes ``.venv-rmq5`` and runs the demo there.  The client writes its own log file when
first imported; :func:`import_client` puts it in the demo's directory.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqha.demo.cluster import Demo
from rmqha.demo.load import ProduceLoad, numbered_body, seq_of
from rmqha.demo.options import TOPIC, DemoOptions
from rmqha.demo.report import warn
from rmqha.errors import RmqhaError
from rmqha.net.loop import EventLoopThread
from rmqha.security.identity import Identity
from rmqha.security.tls import ClientAuth
from rmqha.testing.local_proxy import ProxyProc, start_proxy
from rmqha.testing.secure_setup import SecureSetup
from rmqha.testing.tls_keys import config_keys, process_tls

MISSING_CLIENT = ("rmqha demo --grpc needs RocketMQ 5's Python client (rocketmq-python-client "
                  "and grpcio, the proxy extra), which is not importable here: run `make "
                  "demo-grpc`, which creates .venv-rmq5 with it and runs the demo there")
#: The proxy of the demo: receives may ask for short invisible and polling times, so a
#: delivery whose ack died with the master comes again within the demo's patience.
PROXY_SETTINGS: dict[str, Any] = {
    "min_invisible_time_mills_for_recv": 1000,
    "grpc_client_consumer_min_long_polling_timeout_millis": 1000,
    "log_level": "INFO",
}
CONSUMER_GROUP = "demo-grpc-consumer"
#: The proxy's certificate in the secured demo.
PROXY = Identity.client("proxy")
#: Where grpc looks for the roots a client checks servers against (read once, when the
#: process makes its first TLS channel).
GRPC_ROOTS_ENV = "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"
#: Messages per receive, how long they stay invisible, how long an empty receive waits.
RECEIVE_BATCH = 32
INVISIBLE_S = 5
AWAIT_S = 1
#: Acks of one batch in flight at once.
ACK_THREADS = 8
#: The client's deadline of one request; the proxy waits that long for a new master.
REQUEST_TIMEOUT_S = 5
#: How long the demo repeats a send the client gave up on, and the pause between repeats.
RETRY_DEADLINE_S = 30.0
RETRY_PAUSE_S = 0.05
#: A receive that failed is tried again after this pause (not at once: no request storm).
RECEIVE_PAUSE_S = 0.1


def client_missing() -> str | None:
    """Why the 5.x client cannot be used here (a message naming ``make demo-grpc``), or
    None.  Looks at what is installed without importing it (see :func:`import_client`)."""
    try:
        importlib.metadata.version("rocketmq-python-client")
    except importlib.metadata.PackageNotFoundError:
        return MISSING_CLIENT
    if importlib.util.find_spec("grpc") is None:
        return MISSING_CLIENT
    return None


def proxy_keys(sec: SecureSetup) -> dict[str, Any]:
    """The proxy's config in the secured demo (see the module docstring); issues its
    certificate."""
    sec.issue(PROXY, ips=["127.0.0.1"], dns=["localhost"])
    keys = config_keys(process_tls(sec.pki, PROXY))
    # The official client has no certificate to present: its account is checked instead.
    keys["tls_server_need_client_auth"] = ClientAuth.NONE.value
    return {**keys, "acl_enable": True, "acl_file": str(sec.acl_file),
            "inner_access_key": sec.app.access_key, "inner_secret_key": sec.app.secret_key}


@dataclass
class Rmq5:
    """The imported client, the errors its calls raise, and how it reaches the proxy (TLS,
    the account's keys; plaintext and unsigned without)."""

    module: Any
    errors: tuple[type[BaseException], ...]
    tls: bool = False
    access_key: str = ""
    secret_key: str = ""

    def secure(self, sec: SecureSetup) -> None:
        """Go over TLS, trusting the demo's CA, and sign as the demo's account."""
        os.environ[GRPC_ROOTS_ENV] = sec.ca
        self.tls, self.access_key, self.secret_key = True, sec.app.access_key, sec.app.secret_key

    def configuration(self, endpoint: str) -> Any:
        m = self.module
        return m.ClientConfiguration(endpoint, m.Credentials(self.access_key, self.secret_key),
                                     request_timeout=REQUEST_TIMEOUT_S)

    def message(self, seq: int, size: int) -> Any:
        msg = self.module.Message()
        msg.topic = TOPIC
        msg.body = numbered_body(seq, size)
        return msg


def import_client(log_home: Path) -> Rmq5:
    """Import the 5.x client, or raise RmqhaError naming ``make demo-grpc``.

    The client configures a log file under ``~/logs/rocketmq_python`` when first imported:
    HOME points at ``log_home`` meanwhile, so the demo leaves nothing in the user's home."""
    log_home.mkdir(parents=True, exist_ok=True)
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(log_home)
    try:
        import grpc
        import rocketmq
        from rocketmq.v5.exception import ClientException
    except ImportError as exc:
        raise RmqhaError(f"{MISSING_CLIENT} ({exc})") from None
    finally:
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
    if not hasattr(rocketmq, "SimpleConsumer"):  # the dev extra's 0.4.4 C++ binding
        raise RmqhaError(f"{MISSING_CLIENT} (rocketmq {getattr(rocketmq, '__file__', '')} is "
                         "another client)")
    return Rmq5(rocketmq, (ClientException, grpc.RpcError, TimeoutError, OSError))


# --- the load -------------------------------------------------------------------------------


class GrpcProduceLoad(ProduceLoad):
    """:class:`ProduceLoad` with the 5.x client's Producer: ``in_flight`` senders, each with
    one message outstanding (``send_async``, awaited on the demo's client loop)."""

    after_kill_note = "sent after the kill to the same proxy: the client's route did not change"

    def __init__(self, loop: EventLoopThread, client: Rmq5, endpoint: str, opts: DemoOptions) -> None:
        super().__init__(loop, [endpoint], opts)
        self.client = client
        self.retries = 0
        self._rmq: Any = None

    async def _open(self) -> None:
        producer = self.client.module.Producer(self.client.configuration(self.namesrv[0]), [TOPIC],
                                               tls_enable=self.client.tls)
        try:
            await asyncio.get_running_loop().run_in_executor(None, producer.startup)
        except self.client.errors as exc:
            raise RmqhaError(f"the RocketMQ 5 producer did not start: {exc}") from exc
        self._rmq = producer

    async def _close(self) -> None:
        if self._rmq is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._rmq.shutdown)

    async def _sender(self) -> None:
        while (seqs := await self._take(1)) is not None:
            seq, started = seqs[0], time.monotonic()
            if not await self._send(seq):
                self.send_errors += 1
                continue
            self.acked.add(seq)
            # Sent after the kill, so only a new master can have acknowledged it.
            if self.kill_time is not None and started > self.kill_time \
                    and self.first_ack_after_kill is None:
                self.first_ack_after_kill = time.monotonic()

    async def _send(self, seq: int) -> bool:
        """Send until acknowledged (True) or the retry deadline passes (False)."""
        deadline = time.monotonic() + RETRY_DEADLINE_S
        while True:
            try:
                msg = self.client.message(seq, self.opts.body_bytes)
                await asyncio.wrap_future(self._rmq.send_async(msg))
                return True
            except self.client.errors as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self._stopping or time.monotonic() >= deadline:
                    return False
            self.retries += 1
            await asyncio.sleep(RETRY_PAUSE_S)


class GrpcReceiver:
    """A SimpleConsumer receiving batches and acking every message, on its own thread;
    counts what it received by sequence number (read them once it is stopped)."""

    def __init__(self, client: Rmq5, endpoint: str) -> None:
        self.client = client
        self.endpoint = endpoint
        self.counts: Counter[int] = Counter()
        self.receive_errors = 0
        self.acks_refused = 0
        self.last_error = ""
        #: When it started, and when a receive last brought messages (monotonic).
        self.started_at = self.last_message_at = time.monotonic()
        self._consumer: Any = None
        self.failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ackers = ThreadPoolExecutor(ACK_THREADS, thread_name_prefix="demo-grpc-ack")

    def start(self) -> None:
        """Start the consumer and receive once (its queues' cursors are set from then on),
        then keep receiving on a thread."""
        m = self.client.module
        self.started_at = self.last_message_at = time.monotonic()
        self._consumer = m.SimpleConsumer(self.client.configuration(self.endpoint), CONSUMER_GROUP,
                                          {TOPIC: m.FilterExpression()}, await_duration=AWAIT_S,
                                          tls_enable=self.client.tls)
        try:
            self._consumer.startup()
        except self.client.errors as exc:
            raise RmqhaError(f"the RocketMQ 5 SimpleConsumer did not start: {exc}") from exc
        self._receive_once()
        self._thread = threading.Thread(target=self._run, name="demo-grpc-receiver", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop receiving (a receive in progress ends within its polling time) and shut the
        consumer down; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                warn("the SimpleConsumer's receive did not end in time")
            self._thread = None
        self._ackers.shutdown(wait=True)
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.shutdown()
            except self.client.errors as exc:
                warn(f"the SimpleConsumer did not shut down cleanly: {exc!r}")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._receive_once()
        except BaseException as exc:  # anything unforeseen: the main thread reports it
            self.failure = exc

    def missing(self, acked: set[int]) -> int:
        """How many of ``acked`` have not been received yet (raises RmqhaError if the
        receiving thread failed)."""
        if self.failure is not None:
            raise RmqhaError(f"the SimpleConsumer's thread failed: {self.failure!r}")
        return sum(1 for seq in acked if seq not in self.counts)

    def _receive_once(self) -> None:
        try:
            got = self._consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
        except self.client.errors as exc:
            self.receive_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(RECEIVE_PAUSE_S)
            return
        if got:
            self.last_message_at = time.monotonic()
        self._ack(got)
        for msg in got:
            seq = seq_of(msg.body)
            if seq is not None:
                self.counts[seq] += 1

    def _ack(self, messages: list[Any]) -> None:
        """Ack the batch, several acks at a time (the client's ack_async needs an asyncio
        loop in the calling thread and returns nothing in 5.1.2: the blocking ack on a few
        threads instead); a refused ack is only counted: that message is delivered again
        once its invisible time ends."""
        self.acks_refused += sum(not ok for ok in self._ackers.map(self._ack_one, messages))

    def _ack_one(self, message: Any) -> bool:
        try:
            self._consumer.ack(message)
        except self.client.errors:
            return False
        return True


# --- the scenario ---------------------------------------------------------------------------


class GrpcDemo(Demo):
    """:class:`Demo` with a proxy in front of the cluster and the 5.x client's load."""

    def __init__(self, opts: DemoOptions) -> None:
        super().__init__(opts)
        self.proxy: ProxyProc | None = None
        self.receiver: GrpcReceiver | None = None
        self._client: Rmq5 | None = None
        self.summary.client = "rocketmq-python-client Producer and SimpleConsumer over gRPC"
        self.consumer_group = CONSUMER_GROUP

    def _start_cluster(self) -> None:
        self._client = import_client(Path(self.summary.directory) / "client")
        super()._start_cluster()
        c, sec = self._c, self.security
        keys = proxy_keys(sec) if sec is not None else {}
        self.proxy = start_proxy(c, timeout=60, **PROXY_SETTINGS, **keys)
        if sec is not None:
            self._client.secure(sec)
        self.summary.proxy = f"rmqha proxy {self.proxy.address}"
        self.out.say(f"      proxy (gRPC)     {self.proxy.address:<16} pid {self.proxy.pid:<7} "
                     "the only address the RocketMQ 5 clients are given")
        self.summary.processes_started = len(c.processes)

    def _load_shape(self) -> str:
        return (f"RocketMQ 5's Producer through the proxy, one message per send, "
                f"{self.opts.in_flight} in flight")

    def _new_load(self) -> ProduceLoad:
        assert self._client is not None and self.proxy is not None
        return GrpcProduceLoad(self._l, self._client, self.proxy.address, self.opts)

    def _produce_and_kill(self) -> None:
        assert self._client is not None and self.proxy is not None
        self.receiver = GrpcReceiver(self._client, self.proxy.address)
        self.receiver.start()
        self.out.say(f"      A SimpleConsumer (group {CONSUMER_GROUP}) receives and acks from "
                     f"now on, {RECEIVE_BATCH} at a time, through the same proxy.")
        super()._produce_and_kill()

    def _record_load(self) -> None:
        super()._record_load()
        if isinstance(self.load, GrpcProduceLoad):
            self.summary.send_retries = self.load.retries

    def _consume(self) -> None:
        out, opts = self.out, self.opts
        assert self.load is not None and self.receiver is not None
        acked, receiver = self.load.acked, self.receiver
        out.say("\n[5/5] The SimpleConsumer goes on until it has every acknowledged message")
        bar = out.progress("receive", max(1, len(acked)))
        patience = min(30.0, opts.step_timeout_s)
        while True:
            now, missing = time.monotonic(), receiver.missing(acked)
            bar.update(len(acked) - missing, f"{missing:,} missing")
            quiet = now - receiver.last_message_at
            # Done once every acknowledged message is in and the topic stays quiet
            # (redeliveries may trail); give up after a long silence with some missing.
            if (missing == 0 and quiet >= 1.0) or quiet >= patience:
                break
            time.sleep(0.1)
        receiver.stop()
        out.end_progress()
        self._record_receiver()
        # It has been receiving since before the first send: its rate is over all that time.
        self._record_reads(receiver.counts, receiver.last_message_at - receiver.started_at)

    def _record_receiver(self) -> None:
        if self.receiver is not None:
            self.summary.receive_errors = self.receiver.receive_errors
            self.summary.acks_refused = self.receiver.acks_refused

    def _stop_everything(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()
            self._record_receiver()
        super()._stop_everything()
