"""A real Kafka broker (KRaft, Apache Kafka's own jars) on 127.0.0.1 for the tests, and Spark's Kafka connector.

``make jars`` fetches with Maven, into ``.tools/jars/<set>`` (poms in tests/support/jars/):

* ``kafka-broker``: ``org.apache.kafka:kafka_2.13`` and its dependencies; the broker runs as
  ``java -cp ... kafka.Kafka server.properties`` in combined broker+controller mode, its log folder
  formatted first with ``kafka.tools.StorageTool``;
* ``spark-kafka``: ``spark-sql-kafka-0-10_2.13`` at the installed pyspark's version with
  ``kafka-clients``, ``commons-pool2`` and ``spark-token-provider-kafka-0-10`` (the jars pyspark
  already ships are left out); :func:`tests.support.spark_shapes.make_spark_session` puts them in
  ``spark.jars`` when present.

One broker serves the whole test session (the ``kafka_broker`` fixture); each test makes its own
topics. Tests talk to it with kafka-python (the ``kafka`` extra), as the restore check does.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.support.emulators import JARS, Emulator, _spawn, free_port, jar_files

BROKER_JARS = JARS / "kafka-broker"
CONNECTOR_JARS = JARS / "spark-kafka"


def missing_kafka() -> str | None:
    """Why the Kafka tests cannot run here, or None."""
    if shutil.which("java") is None:
        return "no java on PATH"
    if not any("kafka_2.13" in Path(j).name for j in jar_files(BROKER_JARS)):
        return f"the Kafka broker jars are not in {BROKER_JARS} (make jars)"
    if not any("spark-sql-kafka" in Path(j).name for j in jar_files(CONNECTOR_JARS)):
        return f"Spark's Kafka connector jars are not in {CONNECTOR_JARS} (make jars)"
    try:
        import kafka  # noqa: F401
    except ImportError:
        return "kafka-python is not installed (pip install -e '.[test]')"
    return None


SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={logs}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
group.initial.rebalance.delay.ms=0
log.retention.check.interval.ms=500
log.segment.delete.delay.ms=0
"""


class KafkaBroker(Emulator):
    """The broker process; ``url`` is its bootstrap address ``127.0.0.1:PORT``."""

    @property
    def bootstrap(self) -> str:
        return self.url

    def wait_listening(self, timeout: float = 120.0) -> None:
        from kafka import KafkaAdminClient

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self.process.returncode}: {self.log_tail()}")
            try:
                host, port = self.url.rsplit(":", 1)
                socket.create_connection((host, int(port)), timeout=1).close()
                admin = KafkaAdminClient(bootstrap_servers=self.url, request_timeout_ms=5000)
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except Exception:  # noqa: BLE001 (not up yet: refused, no metadata, ...)
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the Kafka broker did not answer at {self.url} within {timeout:.0f} s: {self.log_tail()}")

    def create_topic(self, name: str, partitions: int, **config: str) -> str:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.url)
        try:
            admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config)])
        finally:
            admin.close()
        return name

    def produce(self, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
        """Send ``(partition, key, value)`` records and wait until the broker has them all."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.url, acks="all", linger_ms=0)
        try:
            for partition, key, value in records:
                producer.send(topic, key=key, value=value, partition=partition)
            producer.flush(timeout=60)
        finally:
            producer.close()

    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        """Move each partition's earliest offset up to ``before[partition]``, as retention does."""
        from kafka import KafkaAdminClient, TopicPartition

        admin = KafkaAdminClient(bootstrap_servers=self.url)
        try:
            admin.delete_records({TopicPartition(topic, p): offset for p, offset in before.items()})
        finally:
            admin.close()


    def delete_topic(self, topic: str) -> None:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.url)
        try:
            admin.delete_topics([topic])
        finally:
            admin.close()


def new_cluster_id() -> str:
    """A random KRaft cluster id, as Kafka's ``Uuid.randomUuid`` makes one: never starting with ``-``
    (the storage tool reads such an id as an option; one CI run in 64 drew one)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def start_kafka() -> KafkaBroker:
    """One broker+controller on free ports of 127.0.0.1, its data and log in a fresh work folder."""
    port, controller = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="kafka-"))
    properties = workdir / "server.properties"
    properties.write_text(SERVER_PROPERTIES.format(port=port, controller=controller, logs=workdir / "data"))
    classpath = str(BROKER_JARS / "*")
    formatted = subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool", "format",
                                "--cluster-id", new_cluster_id(), "-c", str(properties)],
                               capture_output=True, text=True, timeout=120)
    if formatted.returncode != 0:
        raise RuntimeError(f"kafka-storage format failed ({formatted.returncode}):\n{formatted.stdout}{formatted.stderr}")
    process, log = _spawn("kafka", ["java", "-Xmx384m", "-XX:+UseSerialGC", "-cp", classpath, "kafka.Kafka", str(properties)],
                          workdir)
    broker = KafkaBroker("kafka", f"127.0.0.1:{port}", process, workdir, log)
    broker.wait_listening()
    return broker


@pytest.fixture(scope="session")
def kafka_broker():
    """One Kafka broker for the whole session (tests/conftest.py::require_part if it cannot run here)."""
    from tests.support.emulators import running

    yield from running("kafka", missing_kafka, start_kafka)


@pytest.fixture
def kafka_topic(kafka_broker, request):
    """A fresh topic of 3 partitions on the session's broker."""
    name = f"t-{request.node.name[:40]}-{time.monotonic_ns()}".replace("[", "-").replace("]", "")
    return kafka_broker.create_topic("".join(c if c.isalnum() or c in "._-" else "-" for c in name), 3)
