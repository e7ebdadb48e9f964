"""A class-data sharing archive of the classes a Spark driver loads, for every ``spark-submit`` the tests start.

A driver parses about 20,000 classes out of Spark's jars at each start; most of a small job's start on this
machine's 2 cores is that. JDK 13+ records the classes a JVM loaded into an archive at its exit
(``-XX:ArchiveClassesAtExit``, dynamic CDS), and a later JVM with the same class path maps them from it
(``-XX:SharedArchiveFile``): about 13,000 of a driver's classes then come from the archive.

Built once per JDK and Spark install (the key names both) into ``.tools/jvm/`` by running
``jvm_warmup_app.py`` under ``spark-submit``, and handed to every JVM through ``JAVA_TOOL_OPTIONS``. Drivers,
standalone executors and daemons have the class path it was recorded with and use it; any other JVM (Spark's
launcher, a broker, Hadoop's daemons, another Spark home) keeps the JDK's own archive only, and
``-Xlog:cds*=off`` keeps it from saying so on stdout. A failed build leaves every JVM as it was.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / ".tools" / "jvm"
WARMUP_APP = Path(__file__).with_name("jvm_warmup_app.py")
QUIET = "-Xlog:cds*=off,class+path=off"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _key(spark_home: Path) -> str:
    """The JDK's version, the Spark home and its jars (name and size), the warm-up app."""
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr
    jars = sorted((p.name, p.stat().st_size) for p in (spark_home / "jars").glob("*.jar"))
    text = repr((java, str(spark_home), jars, WARMUP_APP.read_bytes()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _build(archive: Path, spark_home: Path) -> None:
    spark_submit = Path(sys.executable).parent / "spark-submit"
    with tempfile.TemporaryDirectory(prefix="jvm-warmup-") as work:
        partial = Path(work) / "archive.jsa"
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial}", "SPARK_HOME": str(spark_home)}
        subprocess.run([str(spark_submit), str(WARMUP_APP), str(Path(work) / "app")], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        if partial.stat().st_size:
            shutil.copyfile(partial, archive.with_suffix(".partial"))
            os.replace(archive.with_suffix(".partial"), archive)


def driver_archive() -> Path | None:
    """This JDK's and Spark's archive, built on first use (about 30 s); None when it cannot be built."""
    if shutil.which("java") is None:
        return None
    spark_home = _spark_home()
    archive = FOLDER / f"spark-driver-{_key(spark_home)}.jsa"
    FOLDER.mkdir(parents=True, exist_ok=True)
    with open(FOLDER / ".lock", "w") as lock:  # two test runs at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.exists():
            for stale in FOLDER.glob("spark-driver-*.jsa"):
                stale.unlink()
            try:
                _build(archive, spark_home)
            except (OSError, subprocess.SubprocessError) as e:
                print(f"note: no class-data archive for Spark drivers ({e}); they start as before", file=sys.stderr)
                return None
    return archive if archive.exists() else None


def use_for_spark_jvms() -> None:
    """Point every JVM this process starts (and its children start) at the archive, unless its
    ``JAVA_TOOL_OPTIONS`` already names one."""
    options = os.environ.get("JAVA_TOOL_OPTIONS", "")
    if "SharedArchiveFile" in options:
        return
    archive = driver_archive()
    if archive is not None:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{options} -XX:SharedArchiveFile={archive} {QUIET}".strip()
