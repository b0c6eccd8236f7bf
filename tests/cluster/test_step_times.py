"""A rank's own step times for its heartbeat: the median since the last heartbeat, then none."""

from cluster.serve import step_times


def test_take_gives_the_median_since_the_last_take_then_none() -> None:
    step_times.take()  # whatever another test left
    for s in (0.03, 0.01, 0.02, 0.5):
        step_times.record(s)
    assert step_times.take() == 0.025
    assert step_times.take() is None
    for _ in range(step_times.MAX_KEPT + 10):
        step_times.record(1.0)
    step_times.record(0.0)
    assert step_times.take() == 1.0  # only the newest MAX_KEPT are kept
