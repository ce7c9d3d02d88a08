"""Training jobs on a tower: persisted in sqlite, run one worker process each.

States: queued -> running -> succeeded | failed | cancelled. At most
``max_running`` jobs run at once; the rest wait in submission order. Every
progress event updates the job's row and goes to the clients watching it; a
client may leave and watch again from anywhere (the last events are kept).
A tower that restarts finds its jobs: one that was running continues from its
last checkpoint (or from the start when it had none yet); nothing is left
"running" forever and nothing is silently lost. What happened on the way
(restarts, ranks lost) goes to the job's ``history``; ``error`` is only the
reason a job did not succeed.

A job with ``towers`` (multi-tower, data-parallel) is started through the
``rendezvous(job_id, spec)`` hook, which enlists the other towers and returns
rank 0's ``dp`` settings; its worker is distributed.py. When a rank is lost
the job goes back to the queue and resumes from its last checkpoint on the
towers still there (at most ``len(towers) + 1`` times).
"""

import builtins
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
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypedDict, cast

from links.wire import Code, WireError
from reticulum_grid.training import local_steps, trainer

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
    final_loss REAL, adapter_alias TEXT, adapter_blob TEXT, peft_blob TEXT, notified INTEGER DEFAULT 0,
    history TEXT
)"""
COLUMNS = ("id", "owner", "notify", "state", "error", "created", "started", "ended", "step", "total_steps", "loss",
           "lr", "tokens_per_s", "eta_s", "final_loss", "adapter_alias", "adapter_blob", "peft_blob", "history")


class Job(TypedDict):
    """A job as ``get``/``list`` give it (and ``jobs/status`` sends it): its row's COLUMNS.
    Times are Unix seconds; blobs are hex ids."""
    id: str
    owner: str
    notify: str | None
    state: str  # queued, running, or one of TERMINAL
    error: str | None
    created: float
    started: float | None
    ended: float | None
    step: int
    total_steps: int | None
    loss: float | None
    lr: float | None
    tokens_per_s: float | None
    eta_s: float | None
    final_loss: float | None
    adapter_alias: str | None
    adapter_blob: str | None
    peft_blob: str | None
    history: list[str]


#: A job's spec (training/request.py's TrainRequest.job_spec: the request's training fields and what the tower
#: adds, base_path, dataset_path, owner, ...; JSON, kept with the job).
Spec = dict[str, Any]
#: A progress event for watchers (links/jobevents.py): {"type": "state" | "progress" | "note" | "end", ...}.
Event = dict[str, Any]


class JobManager:
    """``publish(job_id, job_dir, spec) -> (adapter blob hex, peft blob hex)`` stores the
    outputs; ``on_end(job)`` is told of every terminal state (for notifications);
    ``on_change()`` of jobs starting and ending (for announces)."""

    def __init__(self, directory: str | os.PathLike[str], publish: Callable[[str, Path, Spec], tuple[str, str]],
                 on_end: Callable[[Job], None] | None = None, on_change: Callable[[], None] | None = None,
                 max_running: int = 1,
                 rendezvous: Callable[[str, Spec], tuple[dict[str, Any], list[str]]] | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.publish = publish
        self.on_end = on_end
        self.on_change = on_change
        self.max_running = max_running
        self._db = sqlite3.connect(self.directory / "jobs.sqlite", check_same_thread=False)
        self._db.execute(SCHEMA)
        if "history" not in [r[1] for r in self._db.execute("PRAGMA table_info(jobs)")]:
            self._db.execute("ALTER TABLE jobs ADD COLUMN history TEXT")  # a database from before it
        self._db.commit()
        self.rendezvous = rendezvous
        self._lost: dict[str, int] = {}
        self._lock = threading.RLock()
        self._procs: dict[str, subprocess.Popen[bytes] | None] = {}  # None: still enlisting its towers
        self._cancelling: set[str] = set()
        self._history: dict[str, deque[Event]] = {}
        self._watchers: dict[str, list[Callable[[Event], None]]] = {}

    # -- queries ----------------------------------------------------------
    def get(self, job_id: str) -> Job:
        with self._lock:
            row = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise WireError(Code.UNKNOWN_JOB, f"no job {job_id!r} on this tower")
        return _job(row)

    def list(self, owner: str | None = None) -> list[Job]:
        query = f"SELECT {', '.join(COLUMNS)} FROM jobs" + (" WHERE owner = ?" if owner else "") + " ORDER BY created"
        with self._lock:
            rows = self._db.execute(query, (owner,) if owner else ()).fetchall()
        return [_job(r) for r in rows]

    def datasets_in_use(self) -> frozenset[str]:
        """Dataset paths (str) of the jobs that have not ended: the store keeps them."""
        with self._lock:
            rows = self._db.execute("SELECT spec FROM jobs WHERE state IN ('queued', 'running')").fetchall()
        return frozenset(json.loads(r[0]).get("dataset_path") for r in rows)

    def running_count(self) -> int:
        return len(self._procs)

    def owner_key(self, job_id: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT owner_key FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    # -- life cycle -------------------------------------------------------
    def submit(self, spec: Spec, owner_hash: str, owner_key: bytes | None = None, notify: str | None = None) -> str:
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

    def recover(self) -> None:
        """After a restart: jobs that were running go back to the queue and
        continue from their last checkpoint."""
        with self._lock:
            stale = [r[0] for r in self._db.execute("SELECT id FROM jobs WHERE state = 'running'")]
            for job_id in stale:
                note = "tower restarted; resuming from the last checkpoint" if (
                    self._job_dir(job_id) / trainer.CHECKPOINT).exists() else "tower restarted; starting again"
                self._update(job_id, state="queued")
                self._note(job_id, note)
                log.info("job %s: %s", job_id, note)
        self.schedule()

    def schedule(self) -> None:
        with self._lock:
            while len(self._procs) < self.max_running:
                row = self._db.execute("SELECT id, spec FROM jobs WHERE state = 'queued' ORDER BY created LIMIT 1"
                                       ).fetchone()
                if row is None:
                    return
                self._start(row[0], json.loads(row[1]))

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job["state"] in TERMINAL:
            return job
        with self._lock:
            proc = self._procs.pop(job_id, None) if self._procs.get(job_id) is None else self._procs[job_id]
            if proc is None:  # queued, or still enlisting its towers
                self._finish(job_id, "cancelled", error="cancelled before it started")
                return self.get(job_id)
            self._cancelling.add(job_id)
        _signal_group(proc, signal.SIGTERM)

        def kill_if_left() -> None:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)

        threading.Timer(CANCEL_GRACE_S, kill_if_left).start()
        return self.get(job_id)

    def stop(self) -> None:
        """Stop the workers without changing the jobs' states (they resume on restart)."""
        with self._lock:
            procs = [p for p in self._procs.values() if p is not None]  # None: still enlisting towers
            self._procs.clear()
        for proc in procs:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(5)

    # -- watching ---------------------------------------------------------
    def watch(self, job_id: str, sink: Callable[[Event], None]) -> Callable[[], None]:
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

    def _unwatch(self, job_id: str, sink: Callable[[Event], None]) -> None:
        with self._lock:
            sinks = self._watchers.get(job_id, [])
            if sink in sinks:
                sinks.remove(sink)

    def _event(self, job_id: str, event: Event) -> None:
        with self._lock:
            self._history.setdefault(job_id, deque(maxlen=HISTORY)).append(event)
            sinks = list(self._watchers.get(job_id, ()))
        for sink in sinks:
            try:
                sink(event)
            except Exception:
                log.exception("job watcher failed")

    # -- the worker -------------------------------------------------------
    def _job_dir(self, job_id: str) -> Path:
        return self.directory / trainer.check_job_id(job_id)

    def _start(self, job_id: str, spec: Spec) -> None:
        distributed = bool(spec.get("towers")) and self.rendezvous is not None
        proc = None if distributed else self._spawn(job_id, spec, "reticulum_grid.training.trainer")
        self._procs[job_id] = proc
        self._update(job_id, state="running", started=time.time())
        self._event(job_id, {"type": "state", "state": "running"})
        target = self._start_distributed if distributed else self._follow
        threading.Thread(target=target, args=(job_id, proc, spec), name=f"rngrid-job-{job_id}", daemon=True).start()
        if self.on_change:
            self.on_change()

    def _spawn(self, job_id: str, spec: Spec, module: str) -> subprocess.Popen[bytes]:
        job_dir = self._job_dir(job_id)
        job_dir.mkdir(exist_ok=True)
        trainer.write_spec(job_dir, spec)
        with open(job_dir / "worker.log", "ab") as worker_log:
            # Its own process group: a signal reaches the worker and whatever it
            # spawned (torch helpers), and a Ctrl-C meant for the tower does not.
            return subprocess.Popen([sys.executable, "-m", module, str(job_dir)],
                                    stdout=subprocess.PIPE, stderr=worker_log, start_new_session=True,
                                    env={**os.environ, "HF_HUB_OFFLINE": "1", trainer.TOWER_PID_ENV: str(os.getpid())})

    def _start_distributed(self, job_id: str, _proc: None, spec: Spec) -> None:
        """Enlist the other towers (seconds: they are asked over RNS), then run rank 0."""
        dp: dict[str, Any] | None
        try:
            assert self.rendezvous is not None  # _start asks for it
            dp, notes = self.rendezvous(job_id, spec)
        except Exception as e:
            dp, notes, failure = None, [], f"could not start on several towers: {e}"
        for note in notes:
            self._note(job_id, note)
        with self._lock:
            if job_id not in self._procs or self._procs[job_id] is not None:
                return  # cancelled or stopped meanwhile; the other ranks time out on their own
            if dp is None:
                del self._procs[job_id]
            else:
                if "units" not in spec:  # fixed for the job's life: a resumed job repeats the same arithmetic
                    spec = {**spec, "units": dp["units"]}
                    self._update(job_id, spec=json.dumps(spec))
                proc = self._procs[job_id] = self._spawn(job_id, {**spec, "dp": dp},
                                                         "reticulum_grid.training.distributed")
        if dp is None:
            self._finish(job_id, "failed", error=failure)
            self.schedule()
            return
        self._follow(job_id, proc, spec)

    def _follow(self, job_id: str, proc: subprocess.Popen[bytes], spec: Spec) -> None:
        done: dict[str, Any] | None = None
        error: str | None = None
        lost, last_write = False, 0.0
        for line in cast(IO[bytes], proc.stdout):  # _spawn gives it a pipe
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
                error, lost = event["message"], bool(event.get("peer_lost"))
        code = proc.wait()
        with self._lock:
            if self._procs.get(job_id) is not proc:
                return  # stopped with the tower: the job resumes after a restart
            del self._procs[job_id]
            cancelled = job_id in self._cancelling
            self._cancelling.discard(job_id)
        if cancelled:
            self._finish(job_id, "cancelled", error="cancelled by its owner")
        elif lost and self._lost.get(job_id, 0) <= len(spec.get("towers", ())):
            self._lost[job_id] = self._lost.get(job_id, 0) + 1
            self._note(job_id, f"{error}; resuming from the last checkpoint on the towers still there")
            self._update(job_id, state="queued")
            self._event(job_id, {"type": "state", "state": "queued"})
        elif done is not None and code == 0:
            self._publish(job_id, spec, done)
        else:
            self._finish(job_id, "failed", error=error or f"worker exited with code {code}: {self._log_tail(job_id)}")
        self.schedule()

    def _publish(self, job_id: str, spec: Spec, done: dict[str, Any]) -> None:
        try:
            adapter, peft = self.publish(job_id, self._job_dir(job_id), spec)
        except Exception as e:
            log.exception("publishing job %s failed", job_id)
            self._finish(job_id, "failed", error=f"publishing the adapter failed: {e}")
            return
        if done.get("sync"):  # a multi-tower job: what its syncs cost goes into its history
            self._note(job_id, local_steps.describe(done))
        self._finish(job_id, "succeeded", final_loss=done.get("final_loss"), adapter_blob=adapter, peft_blob=peft)

    def _finish(self, job_id: str, state: str, **fields: Any) -> None:
        if state == "succeeded":  # whatever went wrong on the way is history now, not the job's error
            old = self.get(job_id)["error"]
            if old:
                self._note(job_id, old)
            fields["error"] = None
        self._update(job_id, state=state, ended=time.time(), **fields)
        job = self.get(job_id)
        self._event(job_id, _end_event(job))
        if self.on_change:
            self.on_change()
        if self.on_end:
            self.on_end(job)

    def _log_tail(self, job_id: str) -> str:
        try:
            lines = (self._job_dir(job_id) / "worker.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1][-300:] if lines else "no log"

    def _update(self, job_id: str, **fields: Any) -> None:
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                             (*fields.values(), job_id))
            self._db.commit()

    def _note(self, job_id: str, text: str) -> None:
        """Add a line to the job's history (restarts, lost ranks, ...)."""
        with self._lock:
            row = self._db.execute("SELECT history FROM jobs WHERE id = ?", (job_id,)).fetchone()
            history = json.loads(row[0]) if row and row[0] else []
            history.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}")
            self._update(job_id, history=json.dumps(history[-HISTORY:]))
        self._event(job_id, {"type": "note", "text": text})

    def mark_notified(self, job_id: str) -> None:
        self._update(job_id, notified=1)

    def unnotified(self) -> builtins.list[Job]:
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE notified = 0 AND state IN "
                                    "('succeeded', 'failed', 'cancelled')").fetchall()
        return [_job(r) for r in rows]


def _job(row: tuple[Any, ...]) -> Job:
    job = dict(zip(COLUMNS, row))
    job["history"] = json.loads(job["history"]) if job["history"] else []
    return cast(Job, job)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to a worker's process group (it leads its own session)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass  # already gone


def _summary(job: Job) -> Event:
    return {"type": "state", "state": job["state"], "step": job["step"], "total_steps": job["total_steps"],
            "loss": job["loss"]}


def _end_event(job: Job) -> Event:
    duration = (job["ended"] or time.time()) - (job["started"] or job["created"])
    return {"type": "end", "state": job["state"], "error": job["error"], "final_loss": job["final_loss"],
            "duration_s": round(duration, 1), "adapter_alias": job["adapter_alias"],
            "adapter_blob": job["adapter_blob"], "peft_blob": job["peft_blob"], "step": job["step"],
            "total_steps": job["total_steps"], "history": job["history"]}
