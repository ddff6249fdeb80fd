"""A job's model is resolved once, when the job starts: not again per stage, per checkpoint or per sort."""

from __future__ import annotations

from genbatch.io import RunStore
from genbatch.jobs.schedule import hand_out_order, select_share
from genbatch.models import resolve_model
from genbatch.runner.checkpoint import CheckpointPolicy
from tests.support import executor as drive
from tests.support.runs import job, job_executor


class Counting:
    def __init__(self, wrapped):
        self.wrapped, self.calls = wrapped, []

    def __call__(self, name):
        self.calls.append(name)
        return self.wrapped(name)


def test_a_checkpointed_job_resolves_its_model_and_pipeline_once(tmp_path, monkeypatch):
    import genbatch.runner.execute as execute
    from genbatch.runner.loading import PipelineCache

    resolutions = Counting(resolve_model)
    monkeypatch.setattr(execute, "resolve_model", resolutions)
    real_get, gets = PipelineCache.get, []
    monkeypatch.setattr(PipelineCache, "get", lambda self, spec: gets.append(spec.name) or real_get(self, spec))
    saved = []
    monkeypatch.setattr(RunStore, "save_checkpoint", lambda self, job_id, payload: saved.append(job_id))
    with job_executor(str(tmp_path / "out")) as (world, executor):
        executor.checkpoints = CheckpointPolicy(every_steps=1)
        result = drive.run(executor, job("tiny-wan", num_inference_steps=4))
        executor.writer.close()
    assert result.records[0]["status"] == "done"
    assert saved == ["job"] * 3  # a checkpoint after steps 1, 2 and 3 (none after the last)
    assert resolutions.calls == ["tiny-wan"]  # once for encode, denoise, 3 checkpoints, decode and the media
    assert gets == ["tiny-wan"]


def test_sorting_resolves_each_distinct_model_once():
    jobs = [job(name, id=f"{name}-{index}", row=2 * index + (name == "tiny-flux"))
            for index in range(5) for name in ("tiny-wan", "tiny-flux")]
    spec_of = Counting(resolve_model)
    order = hand_out_order(jobs, spec_of)
    assert sorted(spec_of.calls) == ["tiny-flux", "tiny-wan"]
    assert [job.model for job in order] == ["tiny-wan"] * 5 + ["tiny-flux"] * 5  # grouped by model, first row first
    spec_of.calls.clear()
    select_share(jobs, 0, 2, spec_of)
    assert sorted(spec_of.calls) == ["tiny-flux", "tiny-wan"]
