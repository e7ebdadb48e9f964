"""Build hook only (metadata is in pyproject.toml): the wheel carries the repository's example DAGs.

``dags/`` (the DAGs and jobs.yaml that the tests and ``make demo`` use in a checkout) is copied into the
wheel as ``airflow_savepoints/example_dags/``, where ``airflow-savepoints demo`` and
``airflow-savepoints dags install`` find it after a ``pip install``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

EXAMPLE_DAGS = Path(__file__).resolve().parent / "dags"


class BuildPyWithExampleDags(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return  # an editable install reads dags/ from the checkout
        target = Path(self.build_lib) / "airflow_savepoints" / "example_dags"
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted(EXAMPLE_DAGS.iterdir()):
            if source.suffix in (".py", ".yaml", ".md"):
                shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildPyWithExampleDags})
