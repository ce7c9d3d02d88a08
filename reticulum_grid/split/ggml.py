"""ctypes bindings for the few ggml backend calls a split model needs.

llama-cpp-python binds llama.h but not ggml-backend.h / ggml-rpc.h; the
libraries ship in its wheel when it is built with ``-DGGML_RPC=on``.
Pointers (devices, buffer types) are plain ``int`` addresses.
"""

import ctypes
import functools
import pathlib

#: ggml_backend_dev_type values (ggml-backend.h).
DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU, DEVICE_ACCEL = 0, 1, 2, 3


class RpcUnavailable(RuntimeError):
    """llama-cpp-python was built without ``-DGGML_RPC=on``."""


def _lib_dir():
    import llama_cpp  # loads libllama and, through it, libggml
    return pathlib.Path(llama_cpp.__file__).parent / "lib"


def _bind(lib, name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


@functools.lru_cache(maxsize=1)
def _libs():
    folder = _lib_dir()
    rpc_path = folder / "libggml-rpc.so"
    if not rpc_path.exists():
        raise RpcUnavailable(f"{rpc_path} is missing: build llama-cpp-python with CMAKE_ARGS=-DGGML_RPC=on")
    base = ctypes.CDLL(str(folder / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    ggml = ctypes.CDLL(str(folder / "libggml.so"), mode=ctypes.RTLD_GLOBAL)
    rpc = ctypes.CDLL(str(rpc_path), mode=ctypes.RTLD_GLOBAL)
    p, s, c = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    return {
        "dev_count": _bind(ggml, "ggml_backend_dev_count", s),
        "dev_get": _bind(ggml, "ggml_backend_dev_get", p, s),
        "dev_by_type": _bind(ggml, "ggml_backend_dev_by_type", p, ctypes.c_int),
        "dev_name": _bind(base, "ggml_backend_dev_name", c, p),
        "dev_type": _bind(base, "ggml_backend_dev_type", ctypes.c_int, p),
        "dev_memory": _bind(base, "ggml_backend_dev_memory", None, p, ctypes.POINTER(s), ctypes.POINTER(s)),
        "dev_buffer_type": _bind(base, "ggml_backend_dev_buffer_type", p, p),
        "reg_dev_count": _bind(base, "ggml_backend_reg_dev_count", s, p),
        "reg_dev_get": _bind(base, "ggml_backend_reg_dev_get", p, p, s),
        "rpc_add_server": _bind(rpc, "ggml_backend_rpc_add_server", p, c),
        "rpc_start_server": _bind(rpc, "ggml_backend_rpc_start_server", None, c, c, s, s, ctypes.POINTER(p)),
    }


def rpc_available():
    try:
        _libs()
        return True
    except (RpcUnavailable, OSError, AttributeError):
        return False


def local_devices():
    """This process's own compute devices: the GPUs if llama.cpp has any, else the CPU."""
    lib = _libs()
    devices = [lib["dev_get"](i) for i in range(lib["dev_count"]())]
    gpus = [d for d in devices if lib["dev_type"](d) in (DEVICE_GPU, DEVICE_IGPU)]
    return gpus or [lib["dev_by_type"](DEVICE_CPU)]


def device_name(device):
    return _libs()["dev_name"](device).decode("utf-8", "replace")


def device_memory(device):
    """(free, total) bytes of a device."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _libs()["dev_memory"](device, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def buffer_type(device):
    return _libs()["dev_buffer_type"](device)


def rpc_devices(endpoint):
    """The devices an RPC server at ``endpoint`` ("127.0.0.1:port") offers.

    Connects at once; llama.cpp aborts the process if the server is gone, so
    only a supervised child process may call this."""
    lib = _libs()
    reg = lib["rpc_add_server"](endpoint.encode())
    if not reg:
        raise RuntimeError(f"RPC server at {endpoint} offers no device")
    return [lib["reg_dev_get"](reg, i) for i in range(lib["reg_dev_count"](reg))]


def start_rpc_server(endpoint, cache_dir, n_threads, devices):
    """Serve ``devices`` over llama.cpp's RPC protocol on ``endpoint``. Blocks
    for good (returns only when the server cannot start)."""
    array = (ctypes.c_void_p * len(devices))(*devices)
    _libs()["rpc_start_server"](endpoint.encode(), str(cache_dir).encode() if cache_dir else None,
                                n_threads, len(devices), array)
