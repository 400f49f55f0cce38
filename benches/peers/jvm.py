"""The JVM peers' jars and processes: class paths from the Maven project beside this file,
heaps, and one started JVM (stopped by its pid, its log kept in the run's directory).

``benches/peers/maven`` pins RocketMQ 5.5.0's servers, Kafka 4.1.1 and the Java load
driver; ``mvn package`` there (``make peers-jars``, run by ``make bench-peers``) resolves
them from Maven Central into ~/.m2 and writes ``<module>/target/classpath.txt``.  Nothing
else is downloaded at run time.

Heaps are fixed per role (:class:`Heap`) and named in the table: the machine this runs on
has two cores and every server of every peer shares them, so each JVM gets a heap sized for
that (a RocketMQ broker 512 MiB with a 256 MiB young generation, a Kafka node 512 MiB;
RocketMQ's own scripts ask for 8 GiB, Kafka's for 1 GiB), and the tests run with half.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

MAVEN_DIR = Path(__file__).resolve().parent / "maven"
MODULES = ("rocketmq", "kafka", "driver")
DRIVER_JAR = MAVEN_DIR / "driver" / "target" / "rmqha-peers-driver-0.1.0.jar"
ROCKETMQ_VERSION = "5.5.0"
KAFKA_VERSION = "4.1.1"


class JarsMissing(RuntimeError):
    """The Maven project was not built (or not resolved)."""


@dataclass(frozen=True)
class Heap:
    """A JVM's heap: -Xms = -Xmx (no resizing during a run) and the young generation
    (0: G1 sizes it, as Kafka's scripts leave it)."""

    max_mb: int
    young_mb: int = 0

    def options(self) -> list[str]:
        young = [f"-Xmn{self.young_mb}m"] if self.young_mb else []
        return [f"-Xms{self.max_mb}m", f"-Xmx{self.max_mb}m", *young]

    def __str__(self) -> str:
        return f"-Xmx{self.max_mb}m" + (f" -Xmn{self.young_mb}m" if self.young_mb else "")


#: Heaps of the benchmark run (the table states them) and of the smoke tests.
BENCH_HEAPS = {"broker": Heap(512, 256), "namesrv": Heap(256, 128), "kafka": Heap(512),
               "client": Heap(256, 128)}
TEST_HEAPS = {"broker": Heap(256, 128), "namesrv": Heap(128, 64), "kafka": Heap(256),
              "client": Heap(128, 64)}


def classpath(module: str) -> str:
    """The resolved class path of one module of the Maven project (the driver's own jar
    first); JarsMissing naming the command that builds it."""
    cp_file = MAVEN_DIR / module / "target" / "classpath.txt"
    if not cp_file.exists() or (module == "driver" and not DRIVER_JAR.exists()):
        raise JarsMissing(f"{cp_file} missing: build the JVM peers first "
                          f"(`make peers-jars`, i.e. mvn -B -q package in {MAVEN_DIR})")
    cp = cp_file.read_text().strip()
    return f"{DRIVER_JAR}:{cp}" if module == "driver" else cp


def build(mvn: str = "mvn") -> None:
    """``mvn package`` in the Maven project unless every class path is there already."""
    try:
        for module in MODULES:
            classpath(module)
        return
    except JarsMissing:
        pass
    subprocess.run([mvn, "-B", "-q", "package"], cwd=MAVEN_DIR, check=True, timeout=1800)


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


@dataclass
class JvmProc:
    """One server JVM: ``main`` of ``module``'s class path with ``args``, output to ``log``."""

    name: str
    module: str
    main: str
    args: list[str]
    heap: Heap
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    system_properties: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        props = [f"-D{k}={v}" for k, v in self.system_properties.items()]
        return [java(), *self.heap.options(), "-XX:+UseG1GC", "-Djava.net.preferIPv4Stack=true",
                # RocketMQ's controller serializes with Hessian, which reflects into java.lang.
                "--add-opens=java.base/java.lang=ALL-UNNAMED",
                *props, "-cp", classpath(self.module), self.main, *self.args]

    def start(self) -> JvmProc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                         start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL by pid (the failover's fault, and the end of every run)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the servers' shutdown hooks flush), SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
