"""Tower side of a split model: the child process (runner.py), watched.

A dead child (llama.cpp aborts on a failed peer) or a frozen one (no frame
for FREEZE_S during a generation: RPC sets no socket timeouts) ends the
request with a WireError and the child is killed; the tower itself never
runs RPC code, so it keeps serving everything else.
"""

import itertools
import logging
import queue
import subprocess
import sys
import threading
import time

from links.wire import Code, WireError
from reticulum_grid.split.runner import read_frame, write_frame

log = logging.getLogger("rngrid.split")

#: Longest a generation may go without a frame from the child (seconds). A
#: worker that stops answering (frozen, or its Link gone quiet) shows up here.
FREEZE_S = 20.0
#: Longest a split model may take to load: weights cross the tunnels (seconds).
LOAD_TIMEOUT_S = 3600.0
#: A load during which no byte crosses the tunnels for this long is stuck (seconds).
LOAD_QUIET_S = 30.0


class SplitModel:
    """A model split over RPC ``endpoints`` (``counts`` layers each, in order;
    the rest on this tower). ``key`` identifies the plan it was built for."""

    def __init__(self, key, path, n_ctx, endpoints, counts, log_path, threads=0, experts=False, freeze_s=FREEZE_S):
        self.key = key
        self.spec = {"path": str(path), "n_ctx": n_ctx, "endpoints": list(endpoints), "counts": list(counts),
                     "threads": threads, "experts": experts}
        self.log_path = log_path
        self.freeze_s = freeze_s
        self.proc = None
        self.devices = []
        self.n_ctx = 0
        self.weights_mib = {}
        self._frames = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, timeout=LOAD_TIMEOUT_S, moved=None, quiet_s=LOAD_QUIET_S):
        """Start the child and wait for it to load. ``moved()``: bytes the
        model's tunnels carried so far; a load that moves none for
        ``quiet_s`` seconds is stuck (RPC has no timeouts of its own). Raises WireError."""
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "reticulum_grid.split.runner"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out)
        threading.Thread(target=self._read, name="rngrid-split-read", daemon=True).start()
        self._send(self.spec)
        frame = self._loaded(timeout, moved, quiet_s)
        if "error" in frame:
            self.close()
            raise WireError(frame["error"], frame.get("message", "the split model did not load"))
        self.devices, self.n_ctx = frame.get("devices", []), frame.get("n_ctx", 0)
        self.weights_mib = frame.get("weights_mib", {})  # llama.cpp's own account: buffer -> MiB of weights
        log.info("split model up on %s (pid %d)", ", ".join(self.devices), self.proc.pid)
        return self

    def _loaded(self, timeout, moved, quiet_s):
        """The child's first frame, waiting while the tunnels keep moving bytes."""
        deadline, last, quiet_until = time.monotonic() + timeout, None, time.monotonic() + quiet_s
        while True:
            try:
                frame = self._frames.get(timeout=1.0)
            except queue.Empty:
                now, seen = time.monotonic(), moved() if moved else None
                if seen != last:
                    last, quiet_until = seen, now + quiet_s
                if now > deadline or (moved and now > quiet_until):
                    raise self._frozen(quiet_s if now <= deadline else timeout, "loading the split model") from None
                continue
            if frame is None:
                raise self._ended("loading the split model")
            return frame

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def _read(self):
        try:
            while (frame := read_frame(self.proc.stdout)) is not None:
                self._frames.put(frame)
        except (ValueError, OSError) as e:
            log.warning("split model sent garbage: %s", e)
        self._frames.put(None)

    def _send(self, obj):
        try:
            write_frame(self.proc.stdin, obj, self._lock)
        except (OSError, ValueError):
            raise WireError(Code.UNREACHABLE, "the split model process is gone") from None

    def _frozen(self, seconds, what):
        self.close()
        return WireError(Code.TIMEOUT, f"a shard stopped answering while {what} (nothing for {seconds:.0f} s); "
                                       "the split model was stopped")

    def _ended(self, what):
        self._frames.put(None)  # every later call sees the end too
        code = self.proc.wait(5) if self.proc else None
        return WireError(Code.UNREACHABLE, f"the split model process ended (exit {code}) while {what}: "
                                           "a shard tower went away")

    def generate(self, request, cancel, result):
        """Yield (bytes, token ids) like LlamaBackend.generate, filling
        ``result`` (a Generation). ``request``: an InferenceRequest. Raises WireError."""
        job_id = next(self._ids)
        s = request.sampling
        self._send({"op": "generate", "id": job_id, "prompt": request.prompt, "messages": request.messages,
                    "continue_tokens": list(request.continue_tokens),
                    "sampling": {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
                                 "top_k": s.top_k, "min_p": s.min_p, "repeat_penalty": s.repeat_penalty,
                                 "seed": s.seed, "stop": list(s.stop)}})
        cancelled = False
        deadline = time.monotonic() + self.freeze_s
        while True:
            if cancel.is_set() and not cancelled:
                cancelled = True
                self._send({"op": "cancel", "id": job_id})
            try:
                frame = self._frames.get(timeout=0.25)  # wakes to notice a cancel
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise self._frozen(self.freeze_s, "generating") from None
                continue
            if frame is None:
                raise self._ended("generating")
            deadline = time.monotonic() + self.freeze_s
            if frame.get("id") != job_id:
                continue
            if "piece" in frame:
                yield frame["piece"], frame["ids"]
            elif "end" in frame:
                end = frame["end"]
                result.prompt_tokens, result.completion_tokens = end["prompt_tokens"], end["completion_tokens"]
                result.finish_reason, result.ttft_s, result.decode_s = (end["finish_reason"], end["ttft_s"],
                                                                        end["decode_s"])
                return
            elif "error" in frame:
                raise WireError(frame["error"], frame.get("message", ""))

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
