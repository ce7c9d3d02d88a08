"""A tower's training commands (role ``train``) and job notifications.

``genome/train`` (see training/request.py) -> ``{"job_id"}`` at once.
``jobs/status`` ``{"job_id"?}`` -> ``{"jobs": [job, ...]}``: the caller's jobs (an admin sees all).
``jobs/watch`` ``{"job_id", "watch_id"}`` -> ``{"job": job}``, then JobEvent messages on this
    Link until the job ends or the Link closes; watch again from any client.
``jobs/cancel`` ``{"job_id"}`` -> ``{"job": job}``; the owner or an admin may cancel.
``train/join``: a coordinating tower enlists this one in a multi-tower job (dp.py).

When a job ends its owner gets an LXMF message (to the job's ``notify``
address, default the owner's own LXMF address) naming the state, final loss,
duration and the adapter's alias and blob ids; results are never attached.
"""

import importlib.util
import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from links.channel import ChannelRouter
from links.commands import Command, bind
from links.jobevents import JobEvent
from links.stream import MAX_STREAM_ID
from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.store import gguf_info
from reticulum_grid.training import request as train_request, trainer
from reticulum_grid.inference.registry import ModelSlot
from reticulum_grid.store.blobstore import BlobInfo
from reticulum_grid.training.jobs import Event, Job, JobManager, Spec
from reticulum_grid.training.request import TrainRequest
from reticulum_grid.training.notify import Notifier, delivery_hash
from reticulum_grid.tower.dp import TowerDP

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

log = logging.getLogger("rngrid.tower")

JOB_ID = Field(str, required=True, check=max_len(64))
TRAIN_MODULES = ("torch", "transformers", "peft", "safetensors")
MAX_QUEUED_PER_OWNER = 16


#: Progress events go at most once per this many round trips of the Link: on
#: a radio link (RTT ~1 s) the job's other messages keep room on the air.
PROGRESS_RTTS = 4


class WatchSender:
    """Sends one watch's events in order on their own thread, so a slow Link
    never holds up the job. Progress is thinned to what the Link carries: a
    progress event that a newer one overtook while waiting is dropped, and
    progress goes at most once per PROGRESS_RTTS round trips."""

    def __init__(self, router: ChannelRouter, watch_id: int) -> None:
        self.router, self.watch_id = router, watch_id
        self.queue: queue.Queue[Event | None] = queue.Queue()
        self.sent = self.dropped = 0
        self._held: list[Event | None] = []  # an event taken from the queue while thinning, sent next
        threading.Thread(target=self._run, name=f"rngrid-watch-{watch_id}", daemon=True).start()

    def __call__(self, event: Event) -> None:
        self.queue.put(event)

    def stop(self) -> None:
        self.queue.put(None)

    def _run(self) -> None:
        next_progress = 0.0
        while True:
            event = self._next()
            if event is not None and event.get("type") == "progress":
                time.sleep(max(0.0, next_progress - time.monotonic()))
                event = self._newest_progress(event)
            if event is None or not self.router.send(JobEvent(self.watch_id, event)) or event.get("type") == "end":
                return
            self.sent += 1
            if event.get("type") == "progress":
                next_progress = time.monotonic() + PROGRESS_RTTS * (self.router.link.rtt or 0.0)

    def _next(self) -> Event | None:
        return self._held.pop() if self._held else self.queue.get()

    def _newest_progress(self, event: Event) -> Event:
        """``event`` or the newest progress event queued right behind it; the first
        other event queued is kept for the next send."""
        while True:
            try:
                newer = self.queue.get_nowait()
            except queue.Empty:
                return event
            if newer is None or newer.get("type") != "progress":
                self._held.append(newer)
                return event
            self.dropped += 1
            event = newer


class TowerJobs:
    def __init__(self, tower: "TowerParts") -> None:
        self.tower = tower
        self.notifier: Notifier | None = None
        self._modules: dict[bytes, set[str]] = {}
        self.manager = JobManager(tower.config.directory / "jobs", publish=self._publish, on_end=self._notify,
                                  on_change=self._changed, max_running=tower.config.training_jobs,
                                  rendezvous=self._rendezvous)
        self.dp = TowerDP(tower, self.manager)

    def _rendezvous(self, job_id: str, spec: Spec) -> tuple[dict[str, Any], list[str]]:
        return self.dp.rendezvous(job_id, spec)

    def start(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.manager.recover()
        for job in self.manager.unnotified():
            self._notify(job)

    def _changed(self) -> None:
        if self.tower.announcer:
            self.tower.announcer.request("training jobs changed")

    # -- commands ---------------------------------------------------------
    def commands(self) -> list[Command]:
        return [bind("genome/train", self.train), bind("jobs/status", self.status), bind("jobs/watch", self.watch),
                bind("jobs/cancel", self.cancel), *self.dp.commands()]

    def train(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        missing = [m for m in TRAIN_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            raise WireError(Code.UNSUPPORTED, f"this tower cannot train ({', '.join(missing)} missing); "
                                              "install it with: pip install 'reticulum-grid[train]'")
        asked = TrainRequest.from_map(request)
        if not asked.dataset:
            raise WireError(Code.BAD_REQUEST, "missing field 'dataset'")
        slot = self.tower.registry.find(asked.base)
        dataset = self.tower.store.info(self.tower.store.resolve(asked.dataset))
        if dataset is None:
            raise WireError(Code.UNKNOWN_BLOB, f"dataset {asked.dataset!r} is not complete on this tower")
        asked.check_on(self._base_modules(slot), dataset.path)  # type: ignore[arg-type]  # a complete blob has a path
        # The outputs are published under these aliases: refuse a clash now, not after training.
        self.tower.remote_alias(asked.output_alias, "adapter")
        self.tower.remote_alias(asked.output_alias + train_request.PEFT_SUFFIX, "peft")
        identity = session.identity
        notify = asked.notify or delivery_hash(identity)
        spec = asked.job_spec(base_path=slot.path, dataset_path=str(dataset.path),
                              **self._several_towers(asked, identity, slot, dataset))
        waiting = [j for j in self.manager.list(identity.hash.hex()) if j["state"] == "queued"]
        if len(waiting) >= MAX_QUEUED_PER_OWNER:
            raise WireError(Code.BUSY, f"you have {len(waiting)} jobs queued on this tower already",
                            retry_after=60.0)
        job_id = self.manager.submit(spec, identity.hash.hex(), identity.get_public_key(), notify.hex())
        return {"job_id": job_id}

    def _several_towers(self, asked: TrainRequest, identity: Any, slot: ModelSlot,
                        dataset: BlobInfo) -> dict[str, Any]:
        """What a job with ``towers`` (other than this one) adds to its spec: the
        towers and what the participants need (owner, blob ids); nothing for a
        one-tower job. Raises WireError."""
        own = self.tower.destination.hash.hex()
        towers = [t for t in asked.towers if t != own]
        if not towers:
            return {}
        if not self.tower.config.dataplane:
            raise WireError(Code.UNSUPPORTED, f"{self.tower.config.name} has no [network] dataplane address: "
                                              "it cannot coordinate a multi-tower job")
        return {"towers": towers, "owner": identity.hash.hex(), "base_blob": slot.blob_id.hex(),
                "dataset_blob": dataset.hex}

    def _base_modules(self, slot: ModelSlot) -> set[str]:
        if slot.blob_id not in self._modules:
            self._modules[slot.blob_id] = gguf_info.architecture(slot.path)[2]
        return self._modules[slot.blob_id]

    def status(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = validate(request, {"job_id": Field(str, check=max_len(64))})
        if r["job_id"]:
            return {"jobs": [self._owned(session, r["job_id"])]}
        owner = None if self._is_admin(session) else session.identity.hash.hex()
        return {"jobs": self.manager.list(owner)}

    def watch(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = validate(request, {"job_id": JOB_ID, "watch_id": Field(int, required=True,
                                                                    check=in_range(0, MAX_STREAM_ID))})
        job = self._owned(session, r["job_id"])
        sender = WatchSender(session.router, r["watch_id"])
        unwatch = self.manager.watch(r["job_id"], sender)
        session.on_close(lambda: (unwatch(), sender.stop()))  # type: ignore[func-returns-value]  # a tuple: both run
        return {"job": job}

    def cancel(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = validate(request, {"job_id": JOB_ID})
        self._owned(session, r["job_id"])
        return {"job": self.manager.cancel(r["job_id"])}

    def _owned(self, session: "LinkSession", job_id: str) -> Job:
        job = self.manager.get(job_id)
        if job["owner"] != session.identity.hash.hex() and not self._is_admin(session):
            raise WireError(Code.NOT_ALLOWED, f"job {job_id} belongs to another identity")
        return job

    def _is_admin(self, session: "LinkSession") -> bool:
        return "admin" in self.tower.allow.roles_of(session.identity.hash)

    # -- results ----------------------------------------------------------
    def _publish(self, job_id: str, job_dir: Path, spec: Spec) -> tuple[str, str]:
        store = self.tower.store
        alias = spec["output_alias"]
        gguf = store.add_file(job_dir / trainer.ADAPTER_GGUF, alias=alias, kind="adapter", copy=True)
        peft = store.add_file(job_dir / trainer.ADAPTER, alias=alias + train_request.PEFT_SUFFIX, kind="peft",
                              copy=True)
        return gguf.hex, peft.hex

    def _notify(self, job: Job) -> None:
        if self.notifier is None or not job["notify"]:
            return
        title = f"rngrid job {job['id']} {job['state']}"
        lines = [f"Training job {job['id']} on tower {self.tower.config.name}: {job['state']}."]
        if job["final_loss"] is not None:
            lines.append(f"Final loss {job['final_loss']:.4f} after {job['step']} steps.")
        if job["adapter_blob"]:
            lines.append(f"Adapter {job['adapter_alias']}: GGUF {job['adapter_blob']}, PEFT {job['peft_blob']}.")
        if job["error"] and job["state"] != "succeeded":
            lines.append(f"Reason: {job['error']}")
        fields = {0xFB: "rngrid/job", 0xFC: msgpack.packb(job, use_bin_type=True)}  # LXMF custom type/data
        self.notifier.send(job["id"], bytes.fromhex(job["notify"]), title, "\n".join(lines), fields,
                           public_key=self.manager.owner_key(job["id"]))

    def notified(self, job_id: str) -> None:
        self.manager.mark_notified(job_id)
