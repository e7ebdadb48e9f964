"""Spark's own words for a failure: its error class and message, from whatever pyspark or py4j raised.

py4j's first line ("An error occurred while calling o50.collectToPython.") says nothing; the error
class (``[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] ...``) or the Java exception's line says what went wrong.
"""

from __future__ import annotations

import re

_CONDITION = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")
MAX_CAUSE = 2000
SPARK_PLAN_MARKER = "\n=== Streaming Query ==="  # a failed query's message ends with its plan: left out


def spark_message(error: BaseException | str) -> str:
    """Spark's message of a failed streaming query, without the plan it appends."""
    return str(error).split(SPARK_PLAN_MARKER, 1)[0].strip()[:4000]


def spark_cause(exc: BaseException) -> str:
    """Spark's error class and message (the first line naming a class, else the Java exception's line,
    else the first line), without the JVM stack."""
    text = str(getattr(exc, "desc", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("at ")]
    for line in lines:
        match = _CONDITION.search(line)
        if match:
            return line[match.start():][:MAX_CAUSE]
    for line in lines:
        if line.startswith(": "):
            return line[2:][:MAX_CAUSE]
    return (lines[0] if lines else type(exc).__name__)[:MAX_CAUSE]
