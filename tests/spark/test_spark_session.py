"""The driver JVM's class-data-sharing archive (spark_bench.session), without a JVM: which
options a start gets, and how an archive written at the JVM's exit is published; and the
resources line (peak memory, CPU) the session reports."""
from __future__ import annotations

import os
import subprocess
import sys

import needs
import pytest
import spark_support
from spark_support import spark  # noqa: F401 - fixture (also puts the repository root on sys.path)

needs.module("pyspark", "the spark extra", module_level=True)
from spark_bench import session  # noqa: E402 - after the optional third-party module


@pytest.fixture
def cache(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setenv("RMQHA_TRENDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(session, "_ARCHIVE_IN_PROGRESS", [])
    return tmp_path / "cache"


def test_first_start_writes_the_archive_under_a_temporary_name(cache) -> None:  # noqa: ANN001
    [create, quiet] = session._class_data_options()
    pending, final = session._ARCHIVE_IN_PROGRESS[0]
    assert create == f"-XX:ArchiveClassesAtExit={pending}" and quiet.startswith("-Xlog:cds")
    assert os.path.dirname(final) == str(cache) and pending.startswith(final)
    assert pending != final and not os.path.exists(final)


def test_later_starts_map_the_published_archive(cache) -> None:  # noqa: ANN001
    final = session.class_data_archive()
    os.makedirs(cache)
    open(final, "wb").close()
    assert session._class_data_options()[0] == f"-XX:SharedArchiveFile={final}"
    assert session._ARCHIVE_IN_PROGRESS == []


class _Stoppable:
    """Just what stop_session touches of a SparkSession: stop() and the gateway process."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        gateway = type("Gateway", (), {"proc": proc})()
        self.sparkContext = type("Context", (), {"_gateway": gateway})()
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize(("exit_code", "published"), [(0, True), (3, False)])
def test_the_archive_is_published_only_after_a_clean_exit(cache, exit_code, published) -> None:  # noqa: ANN001
    session._class_data_options()
    pending, final = session._ARCHIVE_IN_PROGRESS[0]
    # A stand-in for the gateway JVM: writes the archive when its stdin closes, then exits.
    script = (f"import sys; sys.stdin.read(); open({pending!r}, 'wb').write(b'archive'); "
              f"sys.exit({exit_code})")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    fake = _Stoppable(proc)
    session.stop_session(fake, timeout=30)
    assert fake.stopped and proc.returncode == exit_code
    assert os.path.exists(final) is published
    assert not os.path.exists(pending)


def test_archives_of_dead_runs_are_removed(cache) -> None:  # noqa: ANN001
    final = session.class_data_archive()
    os.makedirs(cache)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    abandoned, alive = f"{final}.{dead}.tmp", f"{final}.{os.getppid()}.tmp"
    for path in (abandoned, alive):
        open(path, "wb").close()
    session._class_data_options()
    assert not os.path.exists(abandoned) and os.path.exists(alive)


@spark_support.requires_spark
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")
def test_resource_report_names_peak_memory_and_cpu_of_the_driver_processes(spark) -> None:  # noqa: ANN001
    """The line every rmqha-trends run prints as it stops its session (the cluster test
    checks it in the command's output)."""
    import re
    text = session.resource_report(spark)
    found = re.fullmatch(r"resources: peak RSS python driver (\d+) MiB, driver JVM (\d+) MiB; "
                         r"CPU: driver JVM \+ Python workers (\d+\.\d) s, python driver (\d+\.\d) s", text)
    assert found, text
    python_mib, jvm_mib = int(found.group(1)), int(found.group(2))
    assert 20 < python_mib < 8192 and 50 < jvm_mib < 16384
    assert float(found.group(3)) > 0
