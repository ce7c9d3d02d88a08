"""How a llama.cpp ``llama-server`` runner is started: its settings and the
command line they make (flags as the vendored llama.cpp's common/arg.cpp
names them). inference/runner.py starts and supervises it.
"""

from dataclasses import dataclass

from reticulum_grid.node import engine


@dataclass(frozen=True)
class RunnerSpec:
    """How to start a runner. ``n_ctx``: tokens per slot; ``parallel``: slots;
    ``n_gpu_layers`` -1 for all; ``threads`` 0 for llama.cpp's default;
    ``tensor_split``: each device's share (llama.cpp's device order);
    ``adapters``: GGUF LoRA paths, registered at scale 0 (requests pick theirs);
    ``draft``: a draft model's path for speculative decoding (on
    ``draft_device``, e.g. a split model's own GPU or "none" for its CPU, never
    an RPC device), drafting up to ``draft_max`` tokens a verification and
    stopping at one below probability ``draft_p_min`` (0: llama.cpp's
    defaults, common/common.h); ``embeddings``
    with ``pooling`` (for a model that names none, e.g. a chat model); ``rpc``:
    "127.0.0.1:port" RPC endpoints (split models); ``overrides``:
    llama.cpp ``--override-tensor`` rules ("regex=buffer type"); ``split_mode``:
    llama.cpp's ("tensor"; "": its default, layers) over ``devices`` (names,
    in order; (): llama.cpp's choice)."""
    path: str
    n_ctx: int = 4096
    parallel: int = 1
    n_gpu_layers: int = -1
    threads: int = 0
    tensor_split: tuple[float, ...] = ()
    adapters: tuple[str, ...] = ()
    draft: str = ""
    draft_device: str = ""  # llama.cpp device of the draft ("none": the CPU); "": as the model's
    draft_max: int = 0
    draft_p_min: float = 0.0
    embeddings: bool = False
    pooling: str = ""  # embeddings' pooling ("mean", ...); "": the model's own
    rpc: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    fit: bool = False  # llama.cpp chooses how many layers fit on the GPUs (the rest stay in RAM)
    split_mode: str = ""
    devices: tuple[str, ...] = ()

    def argv(self, port: int) -> list[str]:
        argv = [engine.binary(engine.SERVER), "-m", self.path, "--host", "127.0.0.1", "--port", str(port),
                "-c", str(self.n_ctx * self.parallel), "-np", str(self.parallel),
                "--kv-unified", "--kv-unified-per-slot", str(self.n_ctx), "--no-webui",
                "--fit", "on" if self.fit else "off", "--cache-ram", "0", "--metrics",
                # verbosity 4: llama.cpp's buffer report (placement.py) is logged at this level
                "-lv", "4"]
        if not self.fit:
            argv += ["-ngl", str(999 if self.n_gpu_layers < 0 else self.n_gpu_layers)]
        if self.threads:
            argv += ["-t", str(self.threads), "-tb", str(self.threads)]
        if self.tensor_split:
            argv += ["-ts", ",".join(f"{x:g}" for x in self.tensor_split)]
        for path in self.adapters:
            argv += ["--lora", path]
        if self.adapters:
            argv.append("--lora-init-without-apply")
        if self.draft:
            argv += ["-md", self.draft, "--spec-type", "draft-simple"]
            if self.draft_device:
                argv += ["-devd", self.draft_device, "-ngld", "0" if self.draft_device == "none" else "999"]
            else:
                argv += ["-ngld", str(999 if self.n_gpu_layers < 0 else self.n_gpu_layers)]
            if self.draft_max:
                argv += ["--spec-draft-n-max", str(self.draft_max)]
            if self.draft_p_min:
                argv += ["--spec-draft-p-min", f"{self.draft_p_min:g}"]
        if self.embeddings:
            argv.append("--embeddings")
            if self.pooling:
                argv += ["--pooling", self.pooling]
        if self.rpc:
            argv += ["--rpc", ",".join(self.rpc)]
        if self.devices:  # after --rpc: llama.cpp names the RPC devices as it reads that flag
            argv += ["-dev", ",".join(self.devices)]
        if self.split_mode:
            argv += ["-sm", self.split_mode]
        for rule in self.overrides:
            argv += ["-ot", rule]
        return argv
