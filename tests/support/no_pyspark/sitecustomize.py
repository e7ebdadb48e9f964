"""A host without pyspark, for the test bed's Celery workers (on their PYTHONPATH: tests/support/distributed.py).

With ``TESTBED_NO_PYSPARK=1`` in its environment, a Python process takes the variable out of its
environment and makes ``import pyspark`` fail in itself and in the processes it forks (a Celery worker's
task processes); the processes it executes (spark-submit, a job's driver, the CLI) inherit an
environment without the variable and import pyspark as usual.
"""

import os
import sys

if os.environ.pop("TESTBED_NO_PYSPARK", None) == "1":
    sys.modules["pyspark"] = None  # importing pyspark (or any module of it) raises ModuleNotFoundError
