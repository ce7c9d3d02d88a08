"""Training jobs on a tower: persisted in sqlite, run one worker process each.

States: queued -> running -> succeeded | failed | cancelled. At most
``max_running`` jobs run at once; the rest wait in submission order. Every
progress event updates the job's row and goes to the clients watching it; a
client may leave and watch again from anywhere (the last events are kept).
A tower that restarts finds its jobs: one that was running continues from its
last checkpoint (or from the start when it had none yet); nothing is left
"running" forever and nothing is silently lost.
"""

import json
import logging
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from links.wire import Code, WireError
from reticulum_grid import trainer

log = logging.getLogger("rngrid.jobs")

TERMINAL = ("succeeded", "failed", "cancelled")
HISTORY = 200
#: Seconds a cancelled worker gets to exit before it is killed.
CANCEL_GRACE_S = 10.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, owner_key BLOB, notify TEXT, spec TEXT NOT NULL,
    state TEXT NOT NULL, error TEXT, created REAL NOT NULL, started REAL, ended REAL,
    step INTEGER DEFAULT 0, total_steps INTEGER, loss REAL, lr REAL, tokens_per_s REAL, eta_s REAL,
    final_loss REAL, adapter_alias TEXT, adapter_blob TEXT, peft_blob TEXT, notified INTEGER DEFAULT 0
)"""
COLUMNS = ("id", "owner", "notify", "state", "error", "created", "started", "ended", "step", "total_steps", "loss",
           "lr", "tokens_per_s", "eta_s", "final_loss", "adapter_alias", "adapter_blob", "peft_blob")


class JobManager:
    """``publish(job_id, job_dir, spec) -> (adapter blob hex, peft blob hex)`` stores the
    outputs; ``on_end(job)`` is told of every terminal state (for notifications);
    ``on_change()`` of jobs starting and ending (for announces)."""

    def __init__(self, directory, publish, on_end=None, on_change=None, max_running=1):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.publish = publish
        self.on_end = on_end
        self.on_change = on_change
        self.max_running = max_running
        self._db = sqlite3.connect(self.directory / "jobs.sqlite", check_same_thread=False)
        self._db.execute(SCHEMA)
        self._db.commit()
        self._lock = threading.RLock()
        self._procs = {}
        self._cancelling = set()
        self._history = {}
        self._watchers = {}

    # -- queries ----------------------------------------------------------
    def get(self, job_id):
        with self._lock:
            row = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise WireError(Code.UNKNOWN_JOB, f"no job {job_id!r} on this tower")
        return dict(zip(COLUMNS, row))

    def list(self, owner=None):
        query = f"SELECT {', '.join(COLUMNS)} FROM jobs" + (" WHERE owner = ?" if owner else "") + " ORDER BY created"
        with self._lock:
            rows = self._db.execute(query, (owner,) if owner else ()).fetchall()
        return [dict(zip(COLUMNS, r)) for r in rows]

    def running_count(self):
        return len(self._procs)

    def owner_key(self, job_id):
        with self._lock:
            row = self._db.execute("SELECT owner_key FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    # -- life cycle -------------------------------------------------------
    def submit(self, spec, owner_hash, owner_key=None, notify=None):
        """Queue a job (spec as trainer.py reads it). Returns its id."""
        job_id = secrets.token_hex(6)
        with self._lock:
            self._db.execute("INSERT INTO jobs (id, owner, owner_key, notify, spec, state, created, adapter_alias) "
                             "VALUES (?, ?, ?, ?, ?, 'queued', ?, ?)",
                             (job_id, owner_hash, owner_key, notify, json.dumps(spec), time.time(),
                              spec.get("output_alias")))
            self._db.commit()
        self._event(job_id, {"type": "state", "state": "queued"})
        self.schedule()
        return job_id

    def recover(self):
        """After a restart: jobs that were running go back to the queue and
        continue from their last checkpoint."""
        with self._lock:
            stale = [r[0] for r in self._db.execute("SELECT id FROM jobs WHERE state = 'running'")]
            for job_id in stale:
                note = "tower restarted; resuming from the last checkpoint" if (
                    self._job_dir(job_id) / trainer.CHECKPOINT).exists() else "tower restarted; starting again"
                self._update(job_id, state="queued", error=note)
                log.info("job %s: %s", job_id, note)
        self.schedule()

    def schedule(self):
        with self._lock:
            while len(self._procs) < self.max_running:
                row = self._db.execute("SELECT id, spec FROM jobs WHERE state = 'queued' ORDER BY created LIMIT 1"
                                       ).fetchone()
                if row is None:
                    return
                self._start(row[0], json.loads(row[1]))

    def cancel(self, job_id):
        job = self.get(job_id)
        if job["state"] in TERMINAL:
            return job
        with self._lock:
            proc = self._procs.get(job_id)
            if proc is None:
                self._finish(job_id, "cancelled", error="cancelled before it started")
                return self.get(job_id)
            self._cancelling.add(job_id)
        proc.send_signal(signal.SIGTERM)
        threading.Timer(CANCEL_GRACE_S, lambda: proc.poll() is None and proc.kill()).start()
        return self.get(job_id)

    def stop(self):
        """Stop the workers without changing the jobs' states (they resume on restart)."""
        with self._lock:
            procs = list(self._procs.values())
            self._procs.clear()
        for proc in procs:
            proc.kill()

    # -- watching ---------------------------------------------------------
    def watch(self, job_id, sink):
        """Send ``sink(event)`` the job's recent events, then every new one.
        Returns a function that stops the watch."""
        job = self.get(job_id)
        with self._lock:
            past = list(self._history.get(job_id, ())) or [_summary(job)]
            self._watchers.setdefault(job_id, []).append(sink)
        for event in past:
            sink(event)
        if job["state"] in TERMINAL and past[-1].get("type") != "end":
            sink(_end_event(job))
        return lambda: self._unwatch(job_id, sink)

    def _unwatch(self, job_id, sink):
        with self._lock:
            sinks = self._watchers.get(job_id, [])
            if sink in sinks:
                sinks.remove(sink)

    def _event(self, job_id, event):
        with self._lock:
            self._history.setdefault(job_id, deque(maxlen=HISTORY)).append(event)
            sinks = list(self._watchers.get(job_id, ()))
        for sink in sinks:
            try:
                sink(event)
            except Exception:
                log.exception("job watcher failed")

    # -- the worker -------------------------------------------------------
    def _job_dir(self, job_id):
        return self.directory / job_id

    def _start(self, job_id, spec):
        job_dir = self._job_dir(job_id)
        job_dir.mkdir(exist_ok=True)
        (job_dir / trainer.SPEC).write_text(json.dumps(spec))
        with open(job_dir / "worker.log", "ab") as worker_log:
            proc = subprocess.Popen([sys.executable, "-m", "reticulum_grid.trainer", str(job_dir)],
                                    stdout=subprocess.PIPE, stderr=worker_log, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        self._procs[job_id] = proc
        self._update(job_id, state="running", started=time.time())
        self._event(job_id, {"type": "state", "state": "running"})
        threading.Thread(target=self._follow, args=(job_id, proc, spec), name=f"rngrid-job-{job_id}",
                         daemon=True).start()
        if self.on_change:
            self.on_change()

    def _follow(self, job_id, proc, spec):
        done, error, last_write = None, None, 0.0
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.pop("event", None)
            if kind == "step":
                self._event(job_id, {"type": "progress", **event})
                if time.monotonic() - last_write > 1.0 or event["step"] == event["total_steps"]:
                    last_write = time.monotonic()
                    self._update(job_id, **{k: event.get(k) for k in
                                            ("step", "total_steps", "loss", "lr", "tokens_per_s", "eta_s")})
            elif kind == "started":
                self._update(job_id, total_steps=event["total_steps"], step=event["resumed_from"])
                self._event(job_id, {"type": "started", **event})
            elif kind == "done":
                done = event
            elif kind == "error":
                error = event["message"]
        code = proc.wait()
        with self._lock:
            if self._procs.get(job_id) is not proc:
                return  # stopped with the tower: the job resumes after a restart
            del self._procs[job_id]
            cancelled = job_id in self._cancelling
            self._cancelling.discard(job_id)
        if cancelled:
            self._finish(job_id, "cancelled", error="cancelled by its owner")
        elif done is not None and code == 0:
            self._publish(job_id, spec, done)
        else:
            self._finish(job_id, "failed", error=error or f"worker exited with code {code}: {self._log_tail(job_id)}")
        self.schedule()

    def _publish(self, job_id, spec, done):
        try:
            adapter, peft = self.publish(job_id, self._job_dir(job_id), spec)
        except Exception as e:
            log.exception("publishing job %s failed", job_id)
            self._finish(job_id, "failed", error=f"publishing the adapter failed: {e}")
            return
        self._finish(job_id, "succeeded", final_loss=done.get("final_loss"), adapter_blob=adapter, peft_blob=peft)

    def _finish(self, job_id, state, **fields):
        self._update(job_id, state=state, ended=time.time(), **fields)
        job = self.get(job_id)
        self._event(job_id, _end_event(job))
        if self.on_change:
            self.on_change()
        if self.on_end:
            self.on_end(job)

    def _log_tail(self, job_id):
        try:
            lines = (self._job_dir(job_id) / "worker.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1][-300:] if lines else "no log"

    def _update(self, job_id, **fields):
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                             (*fields.values(), job_id))
            self._db.commit()

    def mark_notified(self, job_id):
        self._update(job_id, notified=1)

    def unnotified(self):
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE notified = 0 AND state IN "
                                    "('succeeded', 'failed', 'cancelled')").fetchall()
        return [dict(zip(COLUMNS, r)) for r in rows]


def _summary(job):
    return {"type": "state", "state": job["state"], "step": job["step"], "total_steps": job["total_steps"],
            "loss": job["loss"]}


def _end_event(job):
    duration = (job["ended"] or time.time()) - (job["started"] or job["created"])
    return {"type": "end", "state": job["state"], "error": job["error"], "final_loss": job["final_loss"],
            "duration_s": round(duration, 1), "adapter_alias": job["adapter_alias"],
            "adapter_blob": job["adapter_blob"], "peft_blob": job["peft_blob"], "step": job["step"],
            "total_steps": job["total_steps"]}
