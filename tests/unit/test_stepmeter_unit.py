"""StepMeter's pure parts and its never-break-training rule, with a fake clock (no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from netopt.torch.stepmeter import StepMeter, exposed_comm_s, render_prometheus


def test_exposed_comm_counts_only_time_after_the_last_bucket() -> None:
    assert exposed_comm_s([1.0, 2.0], [1.5, 2.7], end_s=3.0) == pytest.approx(0.7)
    assert exposed_comm_s([1.0, 2.0], [1.5, 1.9], end_s=3.0) == 0.0  # all overlapped
    assert exposed_comm_s([1.0], [9.0], end_s=3.0) == pytest.approx(2.0)  # clipped to the step
    assert exposed_comm_s([], [], end_s=3.0) == 0.0


def test_meter_with_fake_clock_and_a_bad_log_path_goes_on(tmp_path: Path) -> None:
    now = [0.0]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    meter = StepMeter("j", log_path=blocker / "log.jsonl", prom_path=tmp_path / "m.prom",
                      prom_every=1, clock=lambda: now[0])  # fmt: skip

    def loader():
        for i in range(3):
            now[0] += 0.5  # data wait
            yield i

    def train() -> None:
        for _ in meter.batches(loader()):
            now[0] += 1.0  # compute

    with pytest.warns(RuntimeWarning, match="cannot write the step log") as caught:
        train()
    assert len(caught) == 1  # warned once, not per step
    assert [r.data_wait_s for r in meter.records] == [0.5, 0.5, 0.5]
    assert [r.compute_s for r in meter.records] == [1.0, 1.0, 1.0]
    text = (tmp_path / "m.prom").read_text()
    assert 'netopt_train_steps_total{job="j",rank="0"} 3' in text
    assert 'netopt_train_data_wait_seconds_total{job="j",rank="0"} 1.5' in text


def test_prometheus_labels_are_escaped() -> None:
    totals = {"step": 1.0, "data_wait": 0.0, "comm_exposed": 0.0, "compute": 1.0}
    text = render_prometheus('a"b\n', 1, totals, 1)
    assert 'job="a\\"b\\n",rank="1"' in text


def test_records_keep_when_the_steps_communication_was_waited_for() -> None:
    now = [0.0]
    meter = StepMeter("j", clock=lambda: now[0])

    class Done:
        def then(self, callback):  # type: ignore[no-untyped-def]
            now[0] += 0.25  # the future completes 0.25 s after the call
            return callback(self)

        def value(self) -> None:
            return None

    hook = meter.wrap_hook(lambda state, bucket: Done())
    for _ in meter.batches(range(2)):
        now[0] += 1.0  # backward's compute, then the last bucket's hook
        hook(None, None)
        now[0] += 0.5  # the optimizer
    first, second = meter.records
    assert (first.comm_from_s, first.comm_to_s) == (1.0, 1.25)
    assert (second.comm_from_s, second.comm_to_s) == (2.75, 3.0)
    assert first.comm_exposed_s == pytest.approx(0.25)
    quiet = StepMeter("k", clock=lambda: now[0])
    for _ in quiet.batches(range(1)):
        now[0] += 1.0
    assert (quiet.records[0].comm_from_s, quiet.records[0].comm_to_s) == (None, None)
