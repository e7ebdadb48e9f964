"""The sink kinds without Spark: what each answers, and the bad declarations refused with a typed error."""

from __future__ import annotations

import pytest

from airflow_savepoints.errors import InvalidInputError
from airflow_savepoints.sinks import KINDS, sink_for


def test_each_kind_says_what_a_rerun_batch_does(tmp_path):
    table = tmp_path / "table"
    (table / "_delta_log").mkdir(parents=True)
    on_rerun = {kind: sink_for(kind, str(table)).on_rerun for kind in KINDS}
    assert on_rerun == {"file": "skipped", "delta": "skipped", "kafka": "written_again", "foreach": "written_again",
                        "foreach_batch": "written_again", "other": "unknown"}
    assert sink_for("foreach_batch", str(table), app_id="writer").on_rerun == "skipped"
    assert sink_for(None, None) is None
    assert sink_for(None, str(table)).kind == "delta"  # a path holding _delta_log
    assert sink_for(None, str(tmp_path / "out")).kind == "file"
    assert sink_for("delta", str(table)).recorded_batch("q") is None  # no commit yet: nothing recorded
    assert sink_for("kafka").recorded_batch("q") is None


@pytest.mark.parametrize(("kind", "path", "app_id", "says"), [
    ("parquet", "/x", None, "unknown sink kind"),
    ("delta", None, None, "needs its path"),
    ("file", None, None, "needs its path"),
    ("kafka", None, "app", "has no app id"),
    ("foreach_batch", None, "app", "needs the path of the Delta table"),
])
def test_a_bad_declaration_is_refused(kind, path, app_id, says):
    with pytest.raises(InvalidInputError, match=says) as refused:
        sink_for(kind, path, app_id=app_id)
    assert refused.value.hint


@pytest.mark.parametrize("sink_kind", [None, "other"])
def test_a_rescale_says_an_unnamed_file_sink_would_miss_its_repartition_batch(sink_kind):
    """A file sink not named to the restore gets no log entry for Spark's repartition batch N+1, and its next
    compaction fails far from the rescale (seen in benchmarks/downtime.py, whose job declared no sink): the
    restore's sink report says so, and names the fix. Without a rescale it says nothing of it."""
    from airflow_savepoints.core.restore import RestoreRequest, plan_sink
    from tests.unit.core.test_models import manifest

    def detail(**asked) -> str:
        request = RestoreRequest(pointer="/sp", target="/ckpt", sink_kind=sink_kind, **asked)
        return plan_sink(manifest(batch_id=77), request).detail

    rescaled = detail(state_partitions=4)
    assert "repartition batch 78" in rescaled and "BATCH_METADATA_NOT_FOUND" in rescaled and "--sink-path" in rescaled
    assert "repartition" not in detail()
