"""Multi-tower training on a tower: enlisting participants, and being one.

Coordinator (the tower a ``genome/train`` job with ``towers`` was sent to;
rank 0): ``rendezvous(job_id, spec)`` runs when the job starts (and again
after a lost rank). A named tower must hold ``train-peer`` on this tower's
own allow-list (the user names the towers; this tower decides whom it gives
its job's secret and data-plane address); others are left out, asked
nothing. It asks each of the others over an RNS Link whether it can
take part (``train/join`` with ``check``), picks a free port on its own
data-plane address and a fresh 32-byte secret, and sends each tower that said
yes its rank, the world size, that address and port, and the secret
(``train/join``). Towers that refuse or do not answer are left out and named
in the job's history.

Participant: ``train/join`` is a tower-to-tower command: the caller needs the
``train-peer`` role here (granted to a tower's identity only, never implied by
``admin``), and the job's owner must hold ``train`` here too. A job is known
by its coordinator and its id (12 hex digits, checked, never a path piece):
a peer reaches only the ranks of jobs it coordinates. It checks that this
tower has a data-plane address, the base model and the dataset (both by blob
id: the client synced them before submitting), and a free training slot;
then starts a distributed.py worker (it ends with the tower) whose spec, with
the job's secret, is readable by this user only. The ``check`` reply names
this tower's data-plane address: rank 0's store front admits connections
from the job's peers' addresses only. A worker of this tower that died by a
signal (``kill -9``) marks the job lost here: it is not rejoined, so the job
resumes without this tower.
"""

import logging
import secrets
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import RNS

from links.commands import Command, bind
from links.wire import Code, Field, WireError, in_range, max_len, validate
from reticulum_grid.node.connection import TowerConnection, wait_until
from reticulum_grid.training import rendezvous as rdv, trainer
from reticulum_grid.training.jobs import JobManager, Spec

if TYPE_CHECKING:
    from reticulum_grid.tower.session import LinkSession
    from reticulum_grid.tower.parts import TowerParts

log = logging.getLogger("rngrid.tower")

def _job_id(value: str) -> str | None:
    try:
        trainer.check_job_id(value)
    except ValueError as e:
        return str(e)
    return None


JOIN = {
    "job_id": Field(str, required=True, check=_job_id),
    "owner": Field(str, required=True, check=max_len(64)),
    "check": Field(bool, default=False),
    "spec": Field(dict, required=True),
    "rank": Field(int, check=in_range(1, 1024)),
    "world_size": Field(int, check=in_range(2, 1024)),
    "units": Field(int, check=in_range(2, 4096)),
    "host": Field(str, check=max_len(64)),
    "port": Field(int, check=in_range(1, 65535)),
    "secret": Field(str, check=max_len(64)),
    "attempt": Field(int, default=0, check=in_range(0, 1 << 20)),
}
#: Spec keys a participant takes from the coordinator (paths are its own).
PORTABLE = ("rank", "alpha", "dropout", "target_modules", "learning_rate", "epochs", "max_steps", "seq_len",
            "batch_size", "seed", "checkpoint_every", "output_alias", "base_blob", "dataset_blob", "sync", "local_steps",
            "outer_lr", "outer_momentum", "freeze_a")
JOIN_TIMEOUT_S = 20.0


class TowerDP:
    def __init__(self, tower: "TowerParts", manager: JobManager) -> None:
        self.tower = tower
        self.manager = manager
        self.peers: dict[str, TowerConnection] = {}
        self.workers: dict[str, subprocess.Popen[bytes]] = {}  # job id -> worker process (this tower as a participant)
        self.lost: dict[str, str] = {}  # job id -> why this tower's rank died
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def commands(self) -> list[Command]:
        return [bind("train/join", self.join)]

    # -- coordinator ------------------------------------------------------
    def rendezvous(self, job_id: str, spec: Spec) -> tuple[dict[str, Any], list[str]]:
        """(rank 0's ``dp`` map, history notes). Raises WireError."""
        dataplane = self.tower.config.dataplane
        if not dataplane:
            raise WireError(Code.UNSUPPORTED, "this tower has no [network] dataplane address")
        portable = {k: spec[k] for k in PORTABLE if k in spec}
        base = {"job_id": job_id, "owner": spec["owner"], "spec": portable}
        ready: list[str] = []
        addresses: list[Any] = []  # their data-plane addresses (strings check_bind_address accepted)
        notes: list[str] = []
        for tower_hex in spec["towers"]:
            try:
                self._check_peer(tower_hex)
                reply = self._peer(tower_hex).request("train/join", {**base, "check": True}, timeout=JOIN_TIMEOUT_S,
                                                      link_timeout=JOIN_TIMEOUT_S)
                address = reply.get("dataplane")
                rdv.check_bind_address(address if isinstance(address, str) else "")
                ready.append(tower_hex)
                addresses.append(address)
            except rdv.RendezvousError as e:
                notes.append(f"tower {tower_hex[:8]} left out: its data-plane address: {e}")
            except WireError as e:
                notes.append(f"tower {tower_hex[:8]} left out: {e.code}: {e.message}")
        units = spec.get("units") or 1 + len(ready)
        ready, addresses = ready[:units - 1], addresses[:units - 1]  # never more ranks than the batch's units
        attempt = self._attempts[job_id] = self._attempts.get(job_id, -1) + 1
        dp = {"world_size": 1 + len(ready), "rank": 0, "units": units, "host": dataplane, "dataplane": dataplane,
              "port": rdv.free_port(dataplane), "secret": secrets.token_bytes(32).hex(), "attempt": attempt,
              "peers": addresses}
        for rank, tower_hex in enumerate(ready, 1):
            self._peer(tower_hex).request("train/join", {**base, **{k: dp[k] for k in (
                "world_size", "units", "host", "port", "secret", "attempt")}, "rank": rank},
                timeout=JOIN_TIMEOUT_S, link_timeout=JOIN_TIMEOUT_S)
        notes.append(f"attempt {attempt}: {dp['world_size']} rank(s): this tower"
                     + "".join(f", {t[:8]}" for t in ready))
        return dp, notes

    def _check_peer(self, tower_hex: str) -> None:
        """Raise WireError(not_allowed) unless the tower at destination ``tower_hex``
        is trusted here with ``train-peer``: it would get the job's secret and this
        tower's data-plane address. A tower not heard yet is asked for its path first."""
        key = bytes.fromhex(tower_hex)
        if RNS.Identity.recall(key) is None:
            RNS.Transport.request_path(key)
            wait_until(lambda: RNS.Identity.recall(key) is not None, JOIN_TIMEOUT_S)
        self.tower.allow.check_tower(key, "train-peer", self.tower.config.name,
                                     "to take part in its training jobs (the job's secret)")

    def _peer(self, tower_hex: str) -> TowerConnection:
        conn = self.peers.get(tower_hex)
        if conn is None:
            conn = self.peers[tower_hex] = TowerConnection(self.tower.identity, bytes.fromhex(tower_hex),
                                                           f"tower {tower_hex[:8]}")
        return conn

    # -- participant ------------------------------------------------------
    def join(self, session: "LinkSession", request: dict[str, Any]) -> dict[str, Any]:
        r = validate(request, JOIN)
        # The coordinator's identity is part of the job's name here: a peer reaches only its own jobs.
        job_id = f"{session.identity.hash.hex()}-{r['job_id']}"
        if not self.tower.config.dataplane:
            raise WireError(Code.UNSUPPORTED, f"{self.tower.config.name} has no [network] dataplane address")
        try:
            owner_roles = self.tower.allow.roles_of(bytes.fromhex(r["owner"]))
        except ValueError:
            raise WireError(Code.BAD_REQUEST, "owner must be an identity hash (hex)") from None
        if "train" not in owner_roles and "admin" not in owner_roles:
            raise WireError(Code.NOT_ALLOWED, f"the job's owner {r['owner']} may not train on "
                                              f"{self.tower.config.name}")
        old = self.workers.get(job_id)
        if old is not None and old.poll() is not None and old.returncode < 0:  # before _follow saw it
            self.lost.setdefault(job_id, f"worker killed by signal {-old.returncode}")
        if job_id in self.lost:
            raise WireError(Code.UNSUPPORTED, f"this tower's rank of job {r['job_id']} died ({self.lost[job_id]})")
        spec = self._local_spec(r["spec"])
        with self._lock:
            busy = any(p.poll() is None for j, p in self.workers.items() if j != job_id)
            if busy or self.manager.running_count() >= self.manager.max_running:
                raise WireError(Code.BUSY, f"{self.tower.config.name} is training already", retry_after=60.0)
            if r["check"]:
                return {"ready": True, "dataplane": self.tower.config.dataplane}
            if None in (r["rank"], r["world_size"], r["units"], r["host"], r["port"], r["secret"]):
                raise WireError(Code.BAD_REQUEST, "train/join needs rank, world_size, units, host, port, secret")
            old = self.workers.pop(job_id, None)
            if old is not None and old.poll() is None:
                old.kill()  # a rank of an earlier attempt (no longer ours: not a lost rank)
            dp = {k: r[k] for k in ("rank", "world_size", "units", "host", "port", "secret", "attempt")}
            dp["dataplane"] = self.tower.config.dataplane
            self.workers[job_id] = proc = self._spawn(job_id, {**spec, "dp": dp})
        threading.Thread(target=self._follow, args=(job_id, proc), name=f"rngrid-rank-{job_id}", daemon=True).start()
        log.info("job %s: rank %d of %d, store at %s:%d", r["job_id"], r["rank"], r["world_size"], r["host"], r["port"])
        return {"ready": True}

    def _local_spec(self, portable: dict[str, Any]) -> Spec:
        """The coordinator's spec with this tower's own paths. Raises WireError."""
        store = self.tower.store
        spec = {k: portable[k] for k in PORTABLE if k in portable}
        for key, kind in (("base_blob", "base model"), ("dataset_blob", "dataset")):
            try:
                info = store.info(bytes.fromhex(spec.get(key) or ""))
            except ValueError:
                info = None
            if info is None:
                raise WireError(Code.UNKNOWN_BLOB, f"the {kind} {str(spec.get(key))[:16]} is not complete on "
                                                   f"{self.tower.config.name}")
            spec[key.replace("_blob", "_path")] = str(info.path)
        return spec

    def _spawn(self, job_id: str, spec: Spec) -> subprocess.Popen[bytes]:
        job_dir = self.tower.config.directory / "jobs" / "ranks" / job_id  # coordinator hex - checked job id
        job_dir.mkdir(parents=True, exist_ok=True)
        trainer.write_spec(job_dir, spec)
        with open(job_dir / "worker.log", "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "reticulum_grid.training.distributed", str(job_dir)],
                                    stdout=out, stderr=out, start_new_session=True)

    def _follow(self, job_id: str, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        with self._lock:
            if code < 0 and self.workers.get(job_id) is proc:
                self.lost[job_id] = f"worker killed by signal {-code}"
        log.info("job %s: this tower's rank ended (exit code %s)", job_id, code)
