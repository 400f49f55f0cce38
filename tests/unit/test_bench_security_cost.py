"""``bench_peers.py --security``: the table it writes, its verdicts on the targets, and the
files its secure cluster runs with (no cluster is started here)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rmqha.errors import AclPermissionError
from rmqha.protocol.codes import RequestCode
from rmqha.security.acl import AclConfig, check_request
from rmqha.security.signature import sign

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

from peers import security_cost  # noqa: E402
from peers.base import Measurement  # noqa: E402


def _bench_peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "benches" / "bench_peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _m(workload: str, msg_per_s: float, p50_ms: float) -> Measurement:
    return Measurement("rmqha", workload, 3, int(msg_per_s), 1.0, 0.1, [p50_ms / 1000] * 3)


def _row(text: str, workload: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {workload} |"))


def test_table_judges_the_targets() -> None:
    text = security_cost.table({
        "one at a time": (_m("one at a time", 2000, 0.400), _m("one at a time", 1900, 0.440)),
        "batch of 32": (_m("batch of 32", 40_000, 0.6), _m("batch of 32", 36_000, 0.7)),
        "window of 256": (_m("window of 256", 20_000, 9.0), _m("window of 256", 10_000, 18.0)),
    }, 1.0, 2)
    assert "| 2,000 (0.400) | 1,900 (0.440) | 0.95x | 1.10x | +0.040 |" in _row(text, "one at a time")
    assert _row(text, "one at a time").endswith("met (+0.040 ms) |")
    assert _row(text, "batch of 32").endswith("met (cost +10.0%) |")
    assert _row(text, "window of 256").endswith("none (reported) |")
    assert "messages per side: one at a time 2,000, batch of 32 40,000" in text


def test_negative_control_targets_missed() -> None:
    text = security_cost.table({
        "one at a time": (_m("one at a time", 2000, 0.400), _m("one at a time", 1900, 0.460)),
        "batch of 32": (_m("batch of 32", 40_000, 0.6), _m("batch of 32", 33_000, 0.7)),
    }, 1.0, 2)
    assert _row(text, "one at a time").endswith("missed (+0.060 ms) |")
    assert _row(text, "batch of 32").endswith("missed (cost +17.5%) |")


@pytest.mark.parametrize("scale", [0.001, 0.01, 1.0])
def test_rounds_send_whole_batches_and_windows(scale: float) -> None:
    for w in security_cost.WORKLOADS:
        n = security_cost.per_round(w, scale, 2)
        assert n >= 2 * w.param and n % w.param == 0, (w.name, n)


def test_the_security_table_has_its_own_markers(tmp_path: Path) -> None:
    bench_peers = _bench_peers()
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    begin, end = security_cost.BEGIN, security_cost.END
    assert doc.count(begin) == 1 and doc.count(end) == 1
    copy = tmp_path / "benchmarks.md"
    copy.write_text(doc, encoding="utf-8")
    bench_peers.write_table(copy, "| workload | new |", begin, end)
    written = copy.read_text(encoding="utf-8")
    head, rest = doc.split(begin)
    assert written == f"{head}{begin}\n| workload | new |\n{end}{rest.split(end)[1]}"
    # The peers table is not touched.
    peers = doc.split(bench_peers.BEGIN)[1].split(bench_peers.END)[0]
    assert written.split(bench_peers.BEGIN)[1].split(bench_peers.END)[0] == peers
    with pytest.raises(SystemExit, match="has no <!-- security-table:begin -->"):
        bench_peers.check_markers(tmp_path / "benchmarks.md", "<!-- security-table:begin -->x", end)


def test_secure_setup_files_name_real_certificates_and_a_narrow_account(tmp_path: Path) -> None:
    setup = security_cost.secure_setup(tmp_path)
    keys = setup.broker_keys("broker-a", "broker-a-2")
    for field in ("tls_server_cert_path", "tls_server_key_path", "tls_server_trust_cert_path",
                  "tls_client_cert_path", "tls_client_key_path", "acl_file"):
        assert Path(keys[field]).is_file(), field
    assert keys["tls_server_mode"] == "enforcing" and keys["tls_server_need_client_auth"] == "require"
    tls = setup.client_options()["tls"]
    assert Path(tls.client_cert_path).is_file() and Path(tls.client_key_path).is_file()
    config = AclConfig.parse(setup.acl_file.read_text())

    def send(topic: str) -> None:
        fields = sign({"a": "bench_async", "b": topic}, b"x", security_cost.PRODUCER_KEY,
                      setup.app.secret_key)
        check_request(config, RequestCode.SEND_MESSAGE_V2, fields, b"x", "127.0.0.1")

    send("Bench3")
    with pytest.raises(AclPermissionError, match="no PUB default permission for topic:Other"):
        send("Other")


def test_failover_row_judges_unchanged() -> None:
    text = security_cost.table({}, 1.0, 2, security_cost.Failover(0.050, 0.080))
    assert _row(text, "failover") == ("| failover | 0.050 s | 0.080 s | | 1.60x | +30 ms | "
                                      "unchanged (≤ 50 ms added): met |")


def test_negative_control_failover_slower() -> None:
    text = security_cost.table({}, 1.0, 2, security_cost.Failover(0.050, 0.120))
    assert _row(text, "failover").endswith("unchanged (≤ 50 ms added): missed |")
    unmeasured = security_cost.table({}, 1.0, 2, security_cost.Failover(0.050, None))
    assert _row(unmeasured, "failover").endswith("unchanged: not measured |")
