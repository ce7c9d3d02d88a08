"""A job that succeeds after its tower restarted keeps no error: what happened
on the way is its history (jobs table, end event, the job map LXMF carries).
Real sqlite, the real training worker on the bundled model."""

import queue
import sqlite3

from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.training.jobs import JobManager
from testbed import SECRET_DATASET as DATA

SPEC = {"rank": 2, "alpha": 4.0, "dropout": 0.0, "target_modules": ["q_proj"], "learning_rate": 1e-3,
        "max_steps": 2, "seq_len": 16, "batch_size": 1, "seed": 0, "checkpoint_every": 100,
        "output_alias": "history-test"}


def stored_outputs(job_id, job_dir, spec):
    """The publish callback: the outputs stay in the job directory."""
    assert (job_dir / "adapter.gguf").exists()
    return "adapter-in-job-dir", "peft-in-job-dir"


def test_a_job_that_succeeds_after_a_restart_keeps_no_error(tmp_path):
    spec = {**SPEC, "base_path": str(default_model_path()), "dataset_path": str(DATA)}
    before = JobManager(tmp_path, stored_outputs, max_running=0)  # the tower before it died: never ran it
    job_id = before.submit(spec, "ab" * 16)
    with sqlite3.connect(tmp_path / "jobs.sqlite") as db:  # it was running when the tower died
        db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (job_id,))
    ended = queue.Queue()
    after = JobManager(tmp_path, stored_outputs, on_end=ended.put)  # the restarted tower
    events = queue.Queue()
    after.watch(job_id, events.put)
    after.recover()
    job = ended.get(timeout=280)  # what the LXMF notification carries
    end = next(e for e in iter(lambda: events.get(timeout=5), None) if e.get("type") == "end")
    listed = after.list()[0]  # what `rngrid jobs` shows
    for view in (job, end, listed):
        assert view["state"] == "succeeded" and view["error"] is None, view
        assert any("tower restarted" in line for line in view["history"]), view
