"""The tower daemon: one RNS destination serving commands for the models it holds.

Request handlers run on RNS's thread for the Link and return at once (rns
0.9.4 runs one Link's handlers one after another); generation runs on its own
thread per stream and talks over the Link's Channel, so a cancel is never
stuck behind it.

Commands: ``caps/full`` (anyone) and ``ai/inference`` (role ``infer``).
"""

import logging
import threading
import time
from dataclasses import dataclass

import RNS

from announce import caps as capscodec
from announce.announcer import APP_NAME, TOWER_ASPECT, Announcer, PingListener
from links import auth, wire
from links.manifest import build as build_manifest
from links.channel import ChannelRouter
from links.stream import StreamRoutes, StreamSender
from links.wire import Code, WireError
from reticulum_grid import hardware, identity, inference_request, rnsnet
from reticulum_grid.admission import Cancelled, ModelQueue
from reticulum_grid.config import LiveAllowList
from reticulum_grid.llama_backend import ContextLengthExceeded, Generation, LlamaBackend, Sampling

log = logging.getLogger("rngrid.tower")


@dataclass
class LoadedModel:
    alias: str
    backend: LlamaBackend
    blob_id: bytes
    size: int
    queue: ModelQueue


class LinkSession:
    """A client's Link: its stream router and the cancel events of its streams."""

    def __init__(self, link, on_closed):
        self.link = link
        self.streams = {}
        self.router = ChannelRouter(link)
        self.stream_routes = StreamRoutes(self.router, on_cancel=self.cancel)
        self._on_closed = on_closed
        link.set_link_closed_callback(self._closed)

    def cancel(self, stream_id):
        event = self.streams.get(stream_id)
        if event is not None:
            event.set()

    def _closed(self, link):
        for event in list(self.streams.values()):
            event.set()
        self._on_closed(link)


class Tower:
    """Start with ``start()``; stop with ``stop()``. ``config`` is a TowerConfig."""

    def __init__(self, config):
        self.config = config
        self.models = {}
        self.sessions = {}
        self.hardware = hardware.CachedProbe()
        self.tokens_per_s = 0.0
        self.destination = None
        self.announcer = None
        self._lock = threading.Lock()
        self._allow = LiveAllowList(config, on_error=lambda e: log.error("allow-list not reloaded: %s", e))

    # -- life cycle -------------------------------------------------------
    def start(self):
        self.identity = identity.load_or_create(self.config.directory / "identity")
        net = self.config.network
        configdir = net.rns_config or rnsnet.write_config(
            self.config.directory / "rns", listen=net.listen, connect=net.connect,
            transport=net.transport, bitrate=net.bitrate)
        rnsnet.start(configdir)
        for model in self.config.models:
            self._load(model)
        self.destination = RNS.Destination(self.identity, RNS.Destination.IN, RNS.Destination.SINGLE,
                                           APP_NAME, TOWER_ASPECT)
        self.destination.set_link_established_callback(self._link_established)
        for path, handler in (("caps/full", self._caps_full), ("ai/inference", self._inference)):
            self.destination.register_request_handler(path, response_generator=handler,
                                                      allow=RNS.Destination.ALLOW_ALL)
        self.announcer = Announcer(self.destination, self.caps, heartbeat_s=self.config.heartbeat_s,
                                   floor_s=self.config.floor_s)
        RNS.Transport.register_announce_handler(PingListener(self.announcer))
        self.announcer.start()
        log.info("tower %s up: destination %s, models %s", self.config.name,
                 RNS.prettyhexrep(self.destination.hash), ", ".join(self.models) or "none")

    def stop(self):
        if self.announcer:
            self.announcer.stop()
        for session in list(self.sessions.values()):
            session.link.teardown()
        rnsnet.stop()

    def _load(self, model):
        backend = LlamaBackend(model.path, n_ctx=model.n_ctx, n_threads=model.threads or None,
                               n_gpu_layers=model.n_gpu_layers)
        manifest = build_manifest(model.path)
        self.models[model.alias] = LoadedModel(model.alias, backend, manifest.blob_id, manifest.total_size,
                                               ModelQueue(self.config.queue_depth))
        self._warm_up(backend)
        log.info("loaded %s (%s, %d MiB, blob %s)", model.alias, model.path,
                 manifest.total_size >> 20, manifest.blob_id.hex()[:16])

    def _warm_up(self, backend):
        # First tokens/s figure for caps, and the first request skips cold caches.
        result = Generation()
        sampling = Sampling(max_tokens=8, temperature=0.0)
        for _ in backend.generate(backend.tokenize_prompt(prompt="Hello"), sampling, threading.Event(), result):
            pass
        self.tokens_per_s = max(self.tokens_per_s, result.tokens_per_s)

    # -- caps -------------------------------------------------------------
    def caps(self):
        queues = [m.queue for m in self.models.values()]
        return capscodec.Caps(
            name=self.config.name,
            hardware=self.hardware(),
            models=tuple(capscodec.ModelCap(m.alias, m.blob_id[:capscodec.SHORT_ID_BYTES], True)
                         for m in self.models.values()),
            load=capscodec.Load(streams=sum(q.running for q in queues), jobs=0,
                                queue=sum(q.waiting for q in queues)),
            tokens_per_s=round(self.tokens_per_s, 1),
            heartbeat_s=int(self.config.heartbeat_s),
        )

    def _caps_full(self, path, data, request_id, link_id, remote_identity, requested_at):
        models = [{"alias": m.alias, "blob_id": m.blob_id, "size": m.size, "n_ctx": m.backend.n_ctx,
                   "loaded": True} for m in self.models.values()]
        return wire.ok(caps=capscodec.encode(self.caps(), budget=1 << 20), models=models)

    # -- links ------------------------------------------------------------
    def _link_established(self, link):
        self._session(link.link_id, link)

    def _session(self, link_id, link=None):
        with self._lock:
            session = self.sessions.get(link_id)
            if session is None:
                link = link or next((l for l in self.destination.links if l.link_id == link_id), None)
                if link is None:
                    raise WireError(Code.INTERNAL, "link not found")
                session = self.sessions[link_id] = LinkSession(link, self._link_closed)
            return session

    def _link_closed(self, link):
        with self._lock:
            self.sessions.pop(link.link_id, None)

    # -- ai/inference -----------------------------------------------------
    def _inference(self, path, data, request_id, link_id, remote_identity, requested_at):
        try:
            auth.require(remote_identity, "infer", self._allow.roles_of)
            return self._start_stream(link_id, inference_request.parse(wire.unpack_map(data)))
        except WireError as e:
            log.info("ai/inference refused: %s", e)
            return wire.error(e.code, e.message, e.retry_after)
        except Exception as e:
            log.exception("ai/inference failed")
            return wire.error(Code.INTERNAL, f"{type(e).__name__}: {e}")

    def _start_stream(self, link_id, request):
        model = self._model(request.model)
        try:
            tokens = model.backend.tokenize_prompt(prompt=request.prompt, messages=request.messages)
        except ContextLengthExceeded as e:
            raise WireError(Code.CONTEXT_LENGTH_EXCEEDED, str(e)) from None
        session = self._session(link_id)
        if request.stream_id in session.streams:
            raise WireError(Code.BAD_REQUEST, f"stream id {request.stream_id} is already in use on this link")
        ahead = model.queue.admit()
        cancel = session.streams[request.stream_id] = threading.Event()
        threading.Thread(target=self._run_stream, args=(session, model, request, tokens, cancel),
                         name=f"rngrid-gen-{request.stream_id}", daemon=True).start()
        return wire.ok(stream_id=request.stream_id, queued=ahead)

    def _model(self, name):
        model = self.models.get(name) or next(
            (m for m in self.models.values() if len(name) >= 8 and m.blob_id.hex().startswith(name.lower())), None)
        if model is None:
            raise WireError(Code.UNKNOWN_MODEL,
                            f"model {name!r} is not on tower {self.config.name}; it has: {', '.join(self.models) or 'none'}")
        return model

    def _run_stream(self, session, model, request, tokens, cancel):
        sender = StreamSender(session.router, request.stream_id)
        started = time.perf_counter()
        try:
            with model.queue.turn(cancel):
                queued_s = time.perf_counter() - started
                result = Generation()
                for piece in model.backend.generate(tokens, request.sampling, cancel, result):
                    sender.push(piece)
            if result.finish_reason == "cancelled":
                sender.fail(Code.CANCELLED, "cancelled by the client")
            else:
                sender.end(result.finish_reason, self._usage(result, queued_s))
                self.tokens_per_s = 0.8 * self.tokens_per_s + 0.2 * result.tokens_per_s
            model.queue.record(time.perf_counter() - started)
        except Cancelled:
            sender.fail(Code.CANCELLED, "cancelled while queued")
        except Exception as e:
            log.exception("generation failed")
            sender.fail(Code.INTERNAL, f"{type(e).__name__}: {e}")
        finally:
            session.streams.pop(request.stream_id, None)

    def _usage(self, result, queued_s):
        return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                "ttft_s": round(result.ttft_s, 4), "tokens_per_s": round(result.tokens_per_s, 2),
                "queued_s": round(queued_s, 4), "tower": self.config.name}
