"""The tower daemon: one RNS destination serving commands for the models it holds.

Request handlers run on RNS's thread for the Link and return at once (rns
0.9.4 runs one Link's handlers one after another); generation and transfers
run on their own threads and talk over the Link's Channel, so a cancel is
never stuck behind them.

Commands: links/commands.py lists every one with the role it needs; each
capability module declares the handlers of its own (``commands()``), and
``merge_commands`` joins them. Chunk requests over the Channel need ``sync``.
"""

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import RNS

from announce import caps as capscodec
from announce.capsfull import BlobFacts, Caller, CapsFull, GpuInfo
from announce.announcer import APP_NAME, RADIO_ANNOUNCES_PER_H, TOWER_ASPECT, Announcer, PingListener
from links import auth, protocol, wire
from links.commands import COMMANDS, Command, bind
from links.wire import Code, WireError
from reticulum_grid.node import hardware, identity, rnsnet
from reticulum_grid.store.blobstore import BlobStore
from reticulum_grid.store.collect import Collector
from reticulum_grid.node.allowlist import LiveAllowList
from reticulum_grid.node.config import TOWER_ROLES, TowerConfig
from reticulum_grid.node.private import keep_private
from reticulum_grid.inference.facts import ModelFactsReader
from reticulum_grid.inference.registry import ModelRegistry, ModelSlot
from reticulum_grid.training.notify import Notifier
from reticulum_grid.tower.blobs import TowerBlobs
from reticulum_grid.tower.jobs import TowerJobs
from reticulum_grid.tower.replies import ReplyCache
from reticulum_grid.tower.shard import TowerShard
from reticulum_grid.tower.split import TowerSplit
from reticulum_grid.tower.inference import TowerInference
from reticulum_grid.tower.parts import TowerParts
from reticulum_grid.tower.session import LinkSession
from reticulum_grid.tower.voice import TowerVoice

log = logging.getLogger("rngrid.tower")


def _versioned(data: object) -> dict[str, Any] | None:
    """The request map in ``data`` without its protocol version (links/protocol.py),
    or None when ``data`` holds no map (the caller raises that after auth).
    Raises WireError(protocol_mismatch)."""
    try:
        request = wire.unpack_map(data)
    except WireError:
        return None
    return protocol.check(request)


def merge_commands(*groups: list[Command]) -> dict[str, Command]:
    """{path: Command} of the capabilities' declared commands. Raises
    ValueError for a path declared twice, one missing from links/commands.py
    (clients would not know it), one without a handler, or a command of that
    table no capability serves."""
    merged: dict[str, Command] = {}
    for command in (c for group in groups for c in group):
        if command.path in merged:
            raise ValueError(f"command {command.path!r} is declared twice")
        if COMMANDS.get(command.path) != command:
            raise ValueError(f"command {command.path!r} differs from its entry in links/commands.py (or has none)")
        if command.handler is None:
            raise ValueError(f"command {command.path!r} has no handler")
        merged[command.path] = command
    missing = [path for path in COMMANDS if path not in merged]
    if missing:
        raise ValueError(f"no capability serves {', '.join(missing)} (links/commands.py lists them)")
    return merged


class Tower:
    """Start with ``start()``; stop with ``stop()``. ``config`` is a TowerConfig."""

    def __init__(self, config: TowerConfig) -> None:
        self.config = config
        self.sessions: dict[bytes, LinkSession] = {}
        self.hardware = hardware.CachedProbe()
        self.tokens_per_s = 0.0
        self.store = BlobStore(config.directory / "blobs")
        self.allow = LiveAllowList(config, on_error=lambda e: log.error("allow-list not reloaded: %s", e))
        # Made by start():
        self.identity: RNS.Identity | None = None
        self.registry: ModelRegistry | None = None
        self.facts: ModelFactsReader | None = None
        self.inference: TowerInference | None = None
        self.voice: TowerVoice | None = None
        self.jobs: TowerJobs | None = None
        self.split: TowerSplit | None = None
        self.shard: TowerShard | None = None
        self.blobs: TowerBlobs | None = None
        self.collector: Collector | None = None
        self.destination: RNS.Destination | None = None
        self.announcer: Announcer | None = None
        self.commands: dict[str, Command] = {}
        self._lock = threading.Lock()

    # -- life cycle -------------------------------------------------------
    def start(self) -> None:
        keep_private(self.config.directory)
        self.identity = identity.load_or_create(self.config.directory / "identity")
        net = self.config.network
        if net.listen and not net.rns_config:
            rnsnet.check_listen(net.listen)
        configdir = net.rns_config or rnsnet.write_config(
            self.config.directory / "rns", listen=net.listen, connect=net.connect,
            transport=net.transport, link_bitrate=net.link_bitrate, network_name=net.network_name,
            passphrase=net.passphrase)
        rnsnet.start(configdir)
        self.registry = ModelRegistry(self.store, self.config.models, self.config.queue_depth,
                                      on_tokens_per_s=self.record_tokens_per_s, log_dir=self.config.directory,
                                      on_slots=self._slots_changed)
        if (warning := hardware.unused_gpu_warning()) is not None:
            log.warning("%s", warning)
        self.registry.load_configured()
        self.facts = ModelFactsReader(self.registry)
        self.facts.warm()  # caps/full answers with every model's memory need and layer count
        # The capabilities read the parts while serving commands, once start() made them all (tower/parts.py).
        parts = cast(TowerParts, self)
        self.jobs = TowerJobs(parts)
        self.inference = TowerInference(parts)
        self.voice = TowerVoice(parts).start()
        self.split = TowerSplit(parts)
        self.shard = TowerShard(parts)
        self.collector = Collector(self.store, self.config.unreferenced_s, self.jobs.manager.datasets_in_use).start()
        self.destination = RNS.Destination(self.identity, RNS.Destination.IN, RNS.Destination.SINGLE,
                                           APP_NAME, TOWER_ASPECT)
        self.destination.set_link_established_callback(lambda link: self._session(link.link_id, link))
        self.blobs = TowerBlobs(parts)
        self.commands = merge_commands(self._commands(), self.inference.commands(), self.voice.commands(),
                                       self.blobs.commands(), self.jobs.commands(), self.split.commands(),
                                       self.shard.commands())
        for path, command in self.commands.items():
            self.destination.register_request_handler(path, response_generator=self._handler(command),
                                                      allow=RNS.Destination.ALLOW_ALL)
        self.announcer = Announcer(self.destination, self.caps, heartbeat_s=self.config.heartbeat_s,
                                   floor_s=self.config.floor_s,
                                   budget=RADIO_ANNOUNCES_PER_H if rnsnet.on_radio() else None)
        # Path responses (RNS answers path requests for us) carry the live caps.
        self.destination.set_default_app_data(self.announcer.app_data)
        RNS.Transport.register_announce_handler(PingListener(self.announcer))
        self.jobs.start(Notifier(self.identity, self.config.directory / "lxmf", self.config.name,
                                 propagation_node=self.config.propagation_node,
                                 # Notifier hands back the keys it was given: job ids (str).
                                 on_delivered=self.jobs.notified))  # type: ignore[arg-type]
        self.announcer.start()
        log.info("tower %s up: destination %s, models %s", self.config.name,
                 RNS.prettyhexrep(self.destination.hash), ", ".join(self.registry.aliases()) or "none")

    def stop(self) -> None:
        if self.announcer:
            self.announcer.stop()
        if self.jobs:
            self.jobs.manager.stop()
        if self.split:
            self.split.stop()
        if self.shard:
            self.shard.stop()
        if self.registry:
            self.registry.close()
        if self.collector:
            self.collector.stop()
        for session in list(self.sessions.values()):
            session.link.teardown()
        rnsnet.stop()

    def record_tokens_per_s(self, value: float) -> None:
        self.tokens_per_s = value if not self.tokens_per_s else 0.8 * self.tokens_per_s + 0.2 * value

    # -- commands ---------------------------------------------------------
    def _commands(self) -> list[Command]:
        """The daemon's own: ``ping`` (an empty reply, so clients time a small
        round trip) and ``caps/full``."""
        return [bind("ping", lambda session, request: {}), bind("caps/full", self._caps_full)]

    def _handler(self, command: Command) -> Callable[..., bytes]:
        """An RNS request handler: auth, msgpack map in, reply map out, every
        failure answered with a coded error. A command answered once
        (``command.answered_once``) sent again gets its first reply, a refusal
        too (its first run may have dropped what it was given), except busy,
        which asks to be sent again."""
        path, role, id_field = command.path, command.role, command.answered_once

        def handle(_path: str, data: object, request_id: bytes, link_id: bytes, remote_identity: Any,
                   requested_at: float) -> bytes:
            if id_field is None or not isinstance(data, (bytes, bytearray)):  # not bytes: run() refuses it
                return run(remote_identity, link_id, data)[0]
            session = self._session(link_id)
            key = ReplyCache.key(path, data)
            reply = session.replies.get(key)
            if reply is not None:
                log.info("%s sent again (its reply was lost?): answered as before", path)
                return reply
            reply, request, code = run(remote_identity, link_id, data)
            if request is not None and id_field in request and code != Code.BUSY:
                session.replies.put(key, reply)
            return reply

        def run(remote_identity: Any, link_id: bytes, data: object) -> tuple[bytes, dict[str, Any] | None, str | None]:
            """(reply bytes, the request map once the command ran with it, else
            None; the error code or None)."""
            ran = None
            try:
                request = _versioned(data)  # a peer on another protocol hears that first
                if role:
                    auth.require(remote_identity, role, self.allow.roles_of, tower_role=role in TOWER_ROLES)
                if request is None:
                    wire.unpack_map(data)  # raises what is wrong with it
                session = self._session(link_id)
                ran = request
                # merge_commands refused a command without a handler; request is None only when
                # unpack_map raised above.
                return wire.ok(**command.handler(session, request)), ran, None  # type: ignore[misc, arg-type]
            except WireError as e:
                log.info("%s refused: %s", path, e)
                return wire.error(e.code, e.message, e.retry_after), ran, e.code
            except Exception as e:
                log.exception("%s failed", path)
                return wire.error(Code.INTERNAL, f"{type(e).__name__}: {e}"), ran, Code.INTERNAL

        return handle

    def _slots_changed(self) -> None:
        """A model's last free slot or last place in its queue was taken, or one
        freed: announce (as the floor allows), so clients waiting out a busy
        grid hear of it at once (a freed queue place too: a queued request takes
        a freed slot at once, so then no free slot is ever announced)."""
        if self.announcer is not None:
            self.announcer.request("free slots or queue places changed")

    def caps(self) -> capscodec.Caps:
        tower = cast(TowerParts, self)  # announced once start() made every part
        jobs, shard, voice = cast(TowerJobs, self.jobs), cast(TowerShard, self.shard), cast(TowerVoice, self.voice)
        slots = tower.registry.slots()
        hardware = tower.registry.truthful(self.hardware())  # cpu when llama.cpp kept a model off the GPU
        return capscodec.Caps(
            name=self.config.name,
            hardware=hardware,
            models=tower.registry.caps_models(),
            adapters=tuple(capscodec.AdapterCap(alias, info.blob_id[:capscodec.SHORT_ID_BYTES])
                           for info in self.store.list() if info.kind == "adapter" for alias in info.aliases[:1]),
            load=capscodec.Load(streams=sum(s.queue.running for s in slots), jobs=jobs.manager.running_count(),
                                queue=sum(s.queue.waiting for s in slots)),
            tokens_per_s=round(self.tokens_per_s, 1),
            heartbeat_s=int(self.config.heartbeat_s),
            lend_mib=shard.lend_mib(hardware),
            voice=voice.caps(),
            at_ms=capscodec.stamp_ms(),
        )

    def remote_alias(self, alias: str | None, kind: str) -> str | None:
        """``alias`` if a client may point it at a blob of ``kind`` here: not one
        of the config's models, not one naming another kind of blob. None stays
        None. Raises WireError (not_allowed, bad_request)."""
        if alias is None:
            return None
        if alias in {m.alias for m in self.config.models}:
            raise WireError(Code.NOT_ALLOWED, f"alias {alias!r} is set by this tower's config")
        self.store.check_alias_kind(alias, kind)
        return alias

    def _caps_full(self, session: LinkSession, request: dict[str, Any]) -> dict[str, Any]:
        voice = cast(TowerVoice, self.voice)  # a command: start() made every part
        caps = self.caps()
        you = None if session.identity is None else Caller(
            identity=session.identity.hash.hex(), roles=tuple(sorted(self.allow.roles_of(session.identity.hash))))
        gpus = () if caps.hardware.backend == "cpu" else tuple(  # each GPU; caps carry their sum
            GpuInfo(index=g.index, name=g.name, total_mib=g.total_mib, free_mib=g.free_mib) for g in self.hardware.gpus)
        return CapsFull(caps=caps, blobs=self._blob_facts(you is not None and bool(you.roles)), gpus=gpus,
                        voice=voice.details(),  # every configured voice engine, ready or not (and why)
                        dataplane=bool(self.config.dataplane),  # offered for training (not the address)
                        you=you).to_map()

    def _blob_facts(self, known: bool) -> tuple[BlobFacts, ...]:
        """caps/full's rows: models and adapters for anyone (they are in the
        public caps anyway), datasets and files only for a ``known`` identity."""
        tower = cast(TowerParts, self)  # for caps/full: start() made every part
        loaded = {s.blob_id for s in tower.registry.slots() if s.loaded}
        rows = []
        for info in self.store.list():
            if not known and info.kind not in ("model", "adapter"):
                continue
            row = BlobFacts("", info.blob_id, info.size, info.kind, info.blob_id in loaded)
            if info.kind == "model":
                try:
                    slot = tower.registry.slot(info.blob_id)
                    # facts.known holds BlobFacts fields by name (typed there as objects).
                    row = replace(row, **tower.registry.placement_info(slot),
                                  **tower.facts.known(slot))  # type: ignore[arg-type]
                    row = replace(row, draft_bytes=_draft_bytes(tower, slot))
                except Exception as e:  # one unreadable GGUF must not hide the rest
                    log.warning("model %s: cannot estimate its memory: %s", (info.aliases or [info.hex])[0], e)
            rows += [replace(row, alias=alias) for alias in info.aliases or [""]]
        return tuple(rows)

    # -- links ------------------------------------------------------------
    def _session(self, link_id: bytes, link: RNS.Link | None = None) -> LinkSession:
        with self._lock:
            session = self.sessions.get(link_id)
            if session is None:
                # A Link arrives once start() made the destination.
                link = link or next((l for l in self.destination.links  # type: ignore[union-attr]
                                     if l.link_id == link_id), None)
                if link is None:
                    raise WireError(Code.INTERNAL, "link not found")
                session = self.sessions[link_id] = LinkSession(link, cast(TowerParts, self))
            return session

    def link_closed(self, link: RNS.Link) -> None:
        with self._lock:
            self.sessions.pop(link.link_id, None)


def _draft_bytes(tower: TowerParts, slot: ModelSlot) -> int | None:
    """The size of the draft model a split of ``slot``'s model coordinated here
    would run beside it (tower/split.py draft_for), None for none, for a draft
    that cannot be found (the split's load reports that) and while the models'
    GGUFs are still being read (draft_for compares their vocabularies; a
    request handler never waits on a file)."""
    if not tower.facts.settled():
        return None
    try:
        draft = tower.split.draft_for(slot)
        return os.path.getsize(draft) if draft else None
    except (OSError, WireError):
        return None
