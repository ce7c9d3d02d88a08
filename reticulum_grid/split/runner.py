"""Child process: one model split over llama.cpp RPC devices.

llama.cpp's RPC client aborts its whole process when a peer fails and sets no
socket timeouts, so a split model never runs inside the tower: the tower
starts ``python -m reticulum_grid.split.runner`` and talks to it over
stdin/stdout in frames (4-byte big-endian length + msgpack map):

    tower -> child: spec {path, n_ctx, threads, endpoints, counts, experts}
                    {"op": "generate", "id", "prompt"|"messages", "continue_tokens", "sampling": {...}}
                    {"op": "cancel", "id"}
    child -> tower: {"ready": True, "n_ctx", "devices", "weights_mib": {buffer: MiB}}
                    | {"error": code, "message"}
                    {"id", "piece": bytes, "ids": [...]} ... then
                    {"id", "end": {prompt_tokens, completion_tokens, finish_reason, ttft_s, decode_s}}
                    | {"id", "error": code, "message"}

The child's own stdout is moved to stderr first, so llama.cpp's prints never
corrupt the frames. It exits when its stdin closes.
"""

import contextlib
import ctypes
import os
import queue
import struct
import sys
import threading

import msgpack

MAX_FRAME = 64 << 20


def write_frame(stream, obj, lock=None):
    data = msgpack.packb(obj, use_bin_type=True)
    with lock or contextlib.nullcontext():
        stream.write(struct.pack(">I", len(data)) + data)
        stream.flush()


def read_frame(stream):
    """The next map, or None at end of stream. Raises ValueError on garbage."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    data = stream.read(size)
    if len(data) < size:
        return None
    obj = msgpack.unpackb(data, raw=False)
    if not isinstance(obj, dict):
        raise ValueError("frame is not a map")
    return obj


class _BuftOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override (llama-cpp-python does not define it)."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@contextlib.contextmanager
def _model_params(devices, overrides):
    """Llama() has no argument for llama_model_params.devices or
    tensor_buft_overrides (its struct has the fields): hand it defaults that
    carry them. This process loads exactly one model, so the swap is safe."""
    import llama_cpp.llama_cpp as lib
    original = lib.llama_model_default_params
    device_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    override_array = None
    if overrides:  # NULL-pattern terminated
        override_array = (_BuftOverride * (len(overrides) + 1))(*[_BuftOverride(p.encode(), b) for p, b in overrides])

    def params():
        p = original()
        p.devices = ctypes.cast(device_array, ctypes.c_void_p)
        if override_array is not None:
            p.tensor_buft_overrides = ctypes.cast(override_array, ctypes.c_void_p)
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = original


def load(spec):
    """A LlamaBackend whose first layers live on the RPC servers at
    ``spec["endpoints"]`` (``spec["counts"]`` layers each, in order) and the
    rest, with the output layer, on this process's own device (last)."""
    from reticulum_grid.inference.llama_backend import LlamaBackend
    from reticulum_grid.split import ggml, experts

    remote = [ggml.rpc_devices(e)[0] for e in spec["endpoints"]]
    local = ggml.local_devices()[0]
    counts = list(spec["counts"])  # layers per device, workers first; the last device also gets the output layer
    overrides = ()
    if spec.get("experts"):
        overrides = experts.overrides(spec["path"], counts, [ggml.buffer_type(d) for d in remote])
        counts = [0] * len(remote) + [sum(counts)]
    split = [float(c) for c in counts[:-1]] + [float(counts[-1] + 1)]
    threads = spec.get("threads") or None
    with _model_params(remote + [local], overrides):
        backend = LlamaBackend(spec["path"], n_ctx=spec["n_ctx"], n_threads=threads, n_gpu_layers=-1,
                               tensor_split=split)
    return backend, [ggml.device_name(d) for d in remote + [local]]


def _generate(backend, job, cancel, out):
    from reticulum_grid.inference.llama_backend import ContextLengthExceeded, Generation, Sampling
    try:
        tokens = backend.tokenize_prompt(prompt=job.get("prompt"), messages=job.get("messages"),
                                         continued=job.get("continue_tokens") or ())
    except ContextLengthExceeded as e:
        return out({"id": job["id"], "error": "context_length_exceeded", "message": str(e)})
    except ValueError as e:
        return out({"id": job["id"], "error": "bad_request", "message": str(e)})
    sampling = Sampling(**{**job["sampling"], "stop": tuple(job["sampling"].get("stop") or ())})
    result = Generation()
    continued = len(job.get("continue_tokens") or ())
    for piece, ids in backend.generate(tokens, sampling, cancel, result, continued=continued):
        out({"id": job["id"], "piece": piece, "ids": list(ids)})
    out({"id": job["id"], "end": {"prompt_tokens": result.prompt_tokens, "finish_reason": result.finish_reason,
                                  "completion_tokens": result.completion_tokens, "ttft_s": result.ttft_s,
                                  "decode_s": result.decode_s}})


def main():
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    lock = threading.Lock()

    def out(obj):
        write_frame(frames_out, obj, lock)

    frames_in = sys.stdin.buffer
    spec = read_frame(frames_in)
    try:
        backend, devices = load(spec)
    except Exception as e:
        out({"error": "internal", "message": f"cannot load the split model: {type(e).__name__}: {e}"})
        return
    placement = getattr(backend, "placement", None)
    weights = {b: mib for (b, kind), mib in placement.buffers.items() if kind == "model"} if placement else {}
    out({"ready": True, "n_ctx": backend.n_ctx, "devices": devices, "weights_mib": weights})
    jobs, current, cancel = queue.Queue(), {"id": None}, threading.Event()

    def read():
        while (frame := read_frame(frames_in)) is not None:
            if frame.get("op") == "cancel" and frame.get("id") == current["id"]:
                cancel.set()
            elif frame.get("op") == "generate":
                jobs.put(frame)
        os._exit(0)  # the tower closed our stdin (or went away)

    threading.Thread(target=read, daemon=True).start()
    while True:
        job = jobs.get()
        cancel.clear()
        current["id"] = job["id"]
        _generate(backend, job, cancel, out)


if __name__ == "__main__":
    main()
