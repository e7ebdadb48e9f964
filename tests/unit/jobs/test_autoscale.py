"""The autoscaler's policy on recorded metric series (no Spark, no I/O): each test fails if its behaviour breaks.

A series is built as the in-job helper records it: one point per trigger, every ``INTERVAL`` seconds,
for a job whose cores each process ``PER_CORE`` rows per second while busy, so a batch's
utilization is its input rate over the application's capacity (cores x PER_CORE).
"""

from __future__ import annotations

import pytest

from airflow_savepoints.jobs.description.metrics import MetricPoint, OperatorPoint
from airflow_savepoints.jobs.description.model import AutoscaleSettings
from airflow_savepoints.jobs.workflows.autoscale import Current, decide, spark_conf_for

INTERVAL = 10.0  # seconds: the trigger interval
PER_CORE = 100.0  # rows per second a core processes while busy
T0 = 1_800_000_000.0


def batches(rates: list[tuple[float, float]], *, cores: int, start: float = T0, run_id: str = "run-1",
            first_batch: int = 0, backlog: list[int] | None = None, partitions: int | None = None) -> list[MetricPoint]:
    """Points for consecutive (seconds, input rows per second) phases of one run."""
    points, when, batch = [], start, first_batch
    for seconds, rate in rates:
        end = when + seconds
        while when < end - 1e-6:  # batches that overrun the interval run back to back
            rows = int(rate * INTERVAL)
            capacity = cores * PER_CORE
            duration = rows / capacity * 1000 if rows else 5.0
            points.append(MetricPoint(
                batch_id=batch, time=when, run_id=run_id, duration_ms=duration, trigger_interval_ms=INTERVAL * 1000,
                input_rows=rows, input_rate=rate, processed_rate=capacity if rows else 0.0, cores=cores,
                backlog=backlog[len(points)] if backlog else None,
                operators=[OperatorPoint(name="stateStoreSave", rows=1000, partitions=partitions)] if partitions else []))
            when += max(INTERVAL, duration / 1000)
            batch += 1
    return points


def policy(**given) -> AutoscaleSettings:
    return AutoscaleSettings(**{"min_executors": 1, "max_executors": 8, "scale_up_after": 300, "scale_down_after": 1800,
                                "cooldown": 900, **given})


def now_after(series: list[MetricPoint]) -> float:
    return series[-1].time + 1


def test_a_load_step_up_held_for_the_window_scales_up_to_the_cores_that_keep_up_at_the_target():
    # 2 cores (capacity 200 rows/s): 120 rows/s (utilization 0.6) for 20 min, then 190 rows/s (0.95) for 6 min
    series = batches([(1200, 120), (360, 190)], cores=2)
    decision = decide(policy(), series, Current(cores=2), now_after(series), [])
    assert decision.action == "scale_up", decision
    # 190 / (0.7 x 100) = 2.71 -> 3 cores
    assert (decision.target_cores, decision.target_executors) == (3, 3)
    assert decision.evidence["rate_per_core"] == pytest.approx(100)
    assert decision.evidence["required_cores"] == pytest.approx(190 / 70, abs=0.01)
    assert decision.evidence["utilization_min"] > 0.9
    # the same step, seen only 4 minutes in: not yet for the whole window
    early = batches([(1200, 120), (240, 190)], cores=2)
    assert decide(policy(), early, Current(cores=2), now_after(early), []).action == "hold"


def test_a_load_step_down_held_for_the_window_scales_down_to_what_the_peak_needs():
    # 4 cores (capacity 400): 300 rows/s (0.75) for 10 min, then 80 rows/s (0.2) for 31 min
    series = batches([(600, 300), (1860, 80)], cores=4)
    decision = decide(policy(), series, Current(cores=4), now_after(series), [])
    assert decision.action == "scale_down", decision
    assert decision.target_cores == 2  # 80 / (0.7 x 100) = 1.14 -> 2
    assert decision.evidence["utilization_max"] < 0.5
    # 25 minutes in: the 30-minute window is not over
    early = batches([(600, 300), (1500, 80)], cores=4)
    assert decide(policy(), early, Current(cores=4), now_after(early), []).reason == "within_band"


def test_noise_around_the_target_holds():
    rates = [(INTERVAL, 140 + (40 if i % 3 == 0 else -25 if i % 3 == 1 else 10)) for i in range(360)]  # 0.575 .. 0.9
    series = batches(rates, cores=2)
    decision = decide(policy(), series, Current(cores=2), now_after(series), [])
    assert (decision.action, decision.reason) == ("hold", "within_band"), decision
    assert decision.evidence["utilization_max"] > policy().target_utilization > decision.evidence["utilization_min"]


def test_a_spike_shorter_than_the_window_holds():
    # 0.6 for 20 min, then 2 minutes at 1.5 (behind), then 3 minutes back at 0.6: seen at the spike's end and after
    spike = batches([(1200, 120), (120, 300)], cores=2)
    assert decide(policy(), spike, Current(cores=2), now_after(spike), []).action == "hold"
    after = batches([(1200, 120), (120, 300), (180, 120)], cores=2)
    assert decide(policy(), after, Current(cores=2), now_after(after), []).action == "hold"
    # the same load for longer than the window is acted on: the window is what held it
    longer = batches([(1200, 120), (330, 300)], cores=2)
    assert decide(policy(), longer, Current(cores=2), now_after(longer), []).action == "scale_up"


def test_a_restarts_catch_up_holds():
    # the old run ran at 0.6; the new run drains a backlog: back-to-back batches (utilization 1.5) for 400 s
    old = batches([(1200, 120)], cores=2, run_id="run-1")
    drained = [200_000 - 3_000 * i for i in range(30)]
    new = batches([(400, 300)], cores=2, run_id="run-2", start=old[-1].time + 60, first_batch=old[-1].batch_id + 1,
                  backlog=drained)
    series = old + new
    decision = decide(policy(), series, Current(cores=2), now_after(series), [])
    assert (decision.action, decision.reason) == ("hold", "catching_up"), decision
    # the same batches in the run that was already going (no restart, no catch-up) are a run that cannot keep up
    steady = old + batches([(400, 300)], cores=2, run_id="run-1", start=old[-1].time + INTERVAL,
                           first_batch=old[-1].batch_id + 1, backlog=drained)
    assert decide(policy(), steady, Current(cores=2), now_after(steady), []).action == "scale_up"
    # and a backlog above max_backlog alone does not count as behind during the catch-up
    assert decide(policy(max_backlog=1000), series, Current(cores=2), now_after(series), []).reason == "catching_up"


def test_the_bounds_clamp_the_target_and_hold_at_them():
    heavy = batches([(1200, 120), (360, 2000)], cores=2)  # needs 2000 / 70 = 29 cores
    decision = decide(policy(max_executors=4), heavy, Current(cores=2), now_after(heavy), [])
    assert (decision.action, decision.target_cores) == ("scale_up", 4)
    at_max = batches([(1200, 240), (360, 2000)], cores=4)
    held = decide(policy(max_executors=4), at_max, Current(cores=4), now_after(at_max), [])
    assert (held.action, held.reason, held.target_cores) == ("hold", "at_max", 4)
    idle = batches([(600, 300), (1860, 10)], cores=4)
    down = decide(policy(min_executors=3), idle, Current(cores=4), now_after(idle), [])
    assert (down.action, down.target_cores) == ("scale_down", 3)
    # executors of 2 cores: whole executors, and the bounds count executors
    two = decide(policy(executor_cores=2, max_executors=2), heavy, Current(cores=2), now_after(heavy), [])
    assert (two.target_cores, two.target_executors) == (4, 2)


def test_the_cooldown_holds_a_decision_the_series_calls_for():
    series = batches([(1200, 120), (360, 190)], cores=2)
    now = now_after(series)
    acted = [{"at_epoch": now - 2000, "outcome": "held"}, {"at_epoch": now - 1000 + 400, "outcome": "acted"}]
    decision = decide(policy(cooldown=900), series, Current(cores=2), now, acted)
    assert (decision.action, decision.reason) == ("hold", "cooldown"), decision
    assert decision.evidence["cooldown_until"]
    # a recommendation is no action: no cooldown after it
    recommended = [{"at_epoch": now - 100, "outcome": "recommended"}]
    assert decide(policy(cooldown=900), series, Current(cores=2), now, recommended).action == "scale_up"
    # and once the cooldown is over, the same series scales up
    assert decide(policy(cooldown=300), series, Current(cores=2), now, acted).action == "scale_up"


def test_after_an_attempt_that_left_the_run_as_it_was_the_cooldown_alone_holds_but_a_new_run_catches_up():
    """A scale-up whose check failed stopped nothing: the same run's batches still count once the cooldown is
    over (no catch-up, which follows a start). A run started by the action counts from its own batches."""
    series = batches([(1200, 120), (360, 190)], cores=2)
    now = now_after(series)
    rolled_back = [{"at_epoch": now - 120, "outcome": "rolled_back"}]  # within the last window
    same_run = decide(policy(cooldown=60), series, Current(cores=2), now, rolled_back)
    assert (same_run.action, same_run.target_cores) == ("scale_up", 3), same_run
    restarted = series[:-10] + [p.model_copy(update={"run_id": "run-2"}) for p in series[-10:]]
    assert restarted[-10].time > now - 120  # the new run's batches all follow the action
    new_run = decide(policy(cooldown=60), restarted, Current(cores=2), now, rolled_back)
    assert (new_run.action, new_run.reason) == ("hold", "no_metrics"), new_run  # its 100 s span no window


def test_nothing_is_decided_while_a_savepoint_or_upgrade_is_in_flight_or_the_job_is_down():
    series = batches([(1200, 120), (360, 190)], cores=2)
    busy = decide(policy(), series, Current(cores=2, in_flight="an upgrade"), now_after(series), [])
    assert (busy.action, busy.reason) == ("hold", "in_flight")
    assert decide(policy(), series, Current(cores=2, running=False), now_after(series), []).reason == "not_running"
    assert decide(policy(), series, Current(cores=2), now_after(series) + 600, []).reason == "no_metrics"  # stale
    assert decide(policy(), [], Current(cores=2), T0, []).reason == "no_metrics"


def test_state_partitions_change_only_when_they_bind():
    series = batches([(1200, 120), (360, 190)], cores=2, partitions=2)
    bounded = policy(min_partitions=2, max_partitions=8)
    binds = decide(bounded, series, Current(cores=2, partitions=2), now_after(series), [])
    assert (binds.target_cores, binds.target_partitions) == (3, 3)  # 3 cores, 2 partitions: the stateful stage binds
    roomy = decide(bounded, series, Current(cores=2, partitions=8), now_after(series), [])
    assert (roomy.target_cores, roomy.target_partitions) == (3, 8)
    skewed = decide(bounded, series, Current(cores=2, partitions=4, skew=3.0), now_after(series), [])
    assert skewed.target_partitions == 8
    unset = decide(policy(), series, Current(cores=2, partitions=2), now_after(series), [])
    assert unset.target_partitions == 2  # no min/max_partitions: never changed
    down = batches([(600, 300), (1860, 80)], cores=4, partitions=4)
    assert decide(bounded, down, Current(cores=4, partitions=4), now_after(down), []).target_partitions == 4


def test_the_spark_conf_of_a_decision_follows_the_runner():
    series = batches([(1200, 120), (360, 190)], cores=2)
    decision = decide(policy(), series, Current(cores=2), now_after(series), [])
    assert spark_conf_for("spark://master:7077", decision, 1) == {"spark.cores.max": "3", "spark.executor.cores": "1"}
    assert spark_conf_for("yarn", decision, 1) == {"spark.executor.instances": "3", "spark.executor.cores": "1"}
    assert spark_conf_for("local[2]", decision, 1) == {}
