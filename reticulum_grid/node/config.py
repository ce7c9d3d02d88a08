"""Tower and client configuration (TOML), and where things live on disk.

Layout (``RNGRID_HOME``, default ``~/.rngrid``)::

    identity            this machine's client identity (rngrid id)
    client.toml         client network settings
    rns/                RNS config written for the client
    tower/tower.toml    default tower config; the tower's identity and rns/ sit beside it

A tower config (every key optional except as noted)::

    name = "tower-a"                    # <= 32 bytes, shown in `rngrid towers`; no control or invisible characters
    [network]
    listen = "127.0.0.1:4242"           # TCP server interface; "" for none
    connect = ["100.64.0.7:4242"]       # TCP client interfaces
    rns_config = ""                     # use this RNS config dir instead of writing one
    transport = false                   # act as an RNS transport node
    link_bitrate = 0                    # bits/s RNS is told these interfaces carry (0: its guess).
                                        # It does NOT limit the rate: below 62.5 kbit/s RNS uses its
                                        # 500-byte MTU, and transport nodes pace announces to 2 % of it
    network_name = ""                   # a private grid's RNS interface access code (IFAC): packets
    passphrase = ""                     # without this name and passphrase are dropped (rnsnet.py).
                                        # Both apply to the RNS config rngrid writes, not to rns_config
    dataplane = ""                      # this tower's IP on the tailnet/LAN for tower-to-tower bulk
                                        # bytes: multi-tower training (torch.distributed) and split
                                        # models (llama.cpp RPC); "" = RNS carries RPC, no training.
                                        # One private address, never 0.0.0.0 or a public one
    [announce]
    heartbeat_s = 900                   # seconds between heartbeat announces
    floor_s = 5                         # never two announces closer than this (seconds, >= 1: rns
                                        # 0.9.4 drops an announce stamped in the same whole second as
                                        # the last one it heard, so a faster one is lost)
    [limits]
    queue_depth = 4                     # requests that may wait per model before "busy"
    training_jobs = 1                   # training jobs run at once (more only with VRAM to spare)
    unreferenced_s = 86400              # blobs without an alias and untouched partial transfers
                                        # are deleted after this long (seconds)
    [shard]
    lend_mib = 8192                     # memory lent to split models (MiB); unset: free memory
                                        # minus a headroom; 0: lend nothing
    threads = 0                         # llama.cpp threads of the RPC server; 0 = all cores
    cache_mib = 65536                   # RPC tensor cache, seeded from this tower's own GGUFs
                                        # (MiB; least recently used first out); 0: no cache
    yield_idle_s = 300                  # a coordinator's plan that moved nothing this long gives
                                        # the RPC server to another coordinator (seconds)
    [lxmf]
    propagation_node = false            # keep job notifications for clients that are offline
    [models.smollm2-135m]
    path = "/path/to/model.gguf"        # required per model: a GGUF, or a model another tool keeps:
                                        # "ollama:qwen2.5-coder:32b", "hf:org/repo/file.gguf",
                                        # "lmstudio:publisher/model/file.gguf" (store/foreign.py),
                                        # found again at every start, served in place
    n_ctx = 4096                        # context window per stream, tokens (2 or more; 0 = the model's own)
    n_gpu_layers = -1                   # -1: all layers on the GPU when there is one
    threads = 0                         # llama.cpp threads; 0 = its default. Towers sharing
                                        # a machine: split the cores between them
    parallel = 0                        # streams served at once (llama-server slots, batched);
                                        # 0 = as many as fit, at most 4; 1 = one at a time
    draft = ""                          # alias of a small model of the same vocabulary for
                                        # speculative decoding ("" = none)
    embeddings = false                  # start with embeddings on (else on the first ai/embeddings)
    preload = true                      # load at start; false: on first use (a model the tower
                                        # holds for split plans it coordinates, say)
    [voice.whisper-base]                # a voice engine (audio/transcribe, audio/speech), by alias
    kind = "stt"                        # stt: speech to text (faster-whisper); tts: text to speech (espeak-ng)
    path = ""                           # stt: a CTranslate2 Whisper model directory; "" = the bundled Whisper base
    device = "auto"                     # stt: auto (CUDA when a GPU and cuBLAS/cuDNN load), cpu or cuda
    threads = 0                         # stt: CPU threads; 0 = CTranslate2's default
    language = ""                       # announced and used when a request names none ("" = detect / any)
    voice = "en-us"                     # tts: espeak-ng's default voice
    [allow]
    "<identity hash hex>" = ["infer"]   # a user's roles: infer, voice, train, sync, admin (admin = those
                                        # and every job; infer covers voice too); a tower's: shard (runs
                                        # layers of its split models here), train-peer (enlists this
                                        # tower in its jobs).
                                        # admin never implies a tower's roles

Bad values raise ConfigError naming the key.
"""

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from announce.unseen import name_problem
from reticulum_grid.node.config_values import ConfigError, bounded, check_alias, seconds, typed
from reticulum_grid.node.voice_config import VoiceConfig, parse_voice  # noqa: F401 (VoiceConfig: part of this API)

ROLES = ("infer", "voice", "train", "sync", "shard", "train-peer", "admin")
#: Roles that only another tower's identity should hold; ``admin`` does not imply them.
TOWER_ROLES = ("shard", "train-peer")
NAME_MAX_BYTES = 32
IDENTITY_HASH_HEX = 32  # RNS truncated hash: 128 bits
#: Largest context window a config may ask for (tokens); llama.cpp takes a uint32.
MAX_N_CTX = 1 << 24
#: Most slots one runner may serve at once.
MAX_PARALLEL = 64

#: Shortest announce floor (seconds): rns 0.9.4 stamps an announce with its whole second and a
#: receiver drops one no newer than the last it heard (Transport: ``announce_emitted > path_timebase``),
#: so two announces within a second lose the second, such as a freed place in a model's queue.
MIN_FLOOR_S = 1.0



#: Other tools whose models a config's ``path`` may name as "<source>:<name>" (store/foreign.py finds them).
MODEL_SOURCES = ("ollama", "hf", "lmstudio")


def is_source_ref(path: str) -> bool:
    """True when a model ``path`` names a model of another tool ("ollama:qwen2.5-coder:32b") rather than a file."""
    return path.partition(":")[0] in MODEL_SOURCES and ":" in path


def home() -> Path:
    """The grid's home directory (RNGRID_HOME or ~/.rngrid), created if missing."""
    path = Path(os.environ.get("RNGRID_HOME") or Path.home() / ".rngrid")
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class NetworkConfig:
    listen: str = ""
    connect: list[str] = field(default_factory=list)
    rns_config: str = ""
    transport: bool = False
    link_bitrate: int = 0  # [network] link_bitrate (rnsnet.config_text)
    network_name: str = ""  # IFAC (rnsnet.config_text)
    passphrase: str = ""


@dataclass
class ModelConfig:
    alias: str
    path: str
    n_ctx: int = 4096
    n_gpu_layers: int = -1
    threads: int = 0
    parallel: int = 0
    draft: str = ""
    embeddings: bool = False
    preload: bool = True


@dataclass
class TowerConfig:
    path: Path
    name: str
    network: NetworkConfig
    models: list[ModelConfig]
    allow: dict[str, list[str]]
    heartbeat_s: float = 900.0
    floor_s: float = 5.0
    queue_depth: int = 4
    training_jobs: int = 1
    propagation_node: bool = False
    lend_mib: int | None = None  # [shard] lend_mib; None: free memory minus a headroom
    shard_threads: int = 0
    shard_cache_mib: int = 65536  # [shard] cache_mib: bound of the RPC tensor cache (split/tensorcache.py)
    shard_yield_idle_s: int = 300  # [shard] yield_idle_s: split/lease.py
    unreferenced_s: float = 86400.0  # store/collect.py's UNREFERENCED_S
    dataplane: str = ""  # [network] dataplane: IP for tower-to-tower bulk traffic; "" = not offered
    voice: list[VoiceConfig] = field(default_factory=list)  # VoiceConfig per [voice.ALIAS]

    @property
    def directory(self) -> Path:
        return self.path.parent


def load_tower(path: str | os.PathLike[str]) -> TowerConfig:
    """Read a tower config. Raises ConfigError (or FileNotFoundError)."""
    path = Path(path)
    doc = read_toml(path)
    net, announce, limits, lxmf, shard = (_table(doc, t) for t in ("network", "announce", "limits", "lxmf", "shard"))
    name = typed(doc, "name", str, path.parent.name or "tower")
    if not name or len(name.encode()) > NAME_MAX_BYTES:
        raise ConfigError(f"name must be 1..{NAME_MAX_BYTES} bytes")
    if (problem := name_problem(name)) is not None:  # the caps decoder refuses it: nobody would hear the tower
        raise ConfigError(f"name {name!a}: {problem}")
    return TowerConfig(
        path=path.resolve(),
        name=name,
        network=_network(net),
        models=[_model(alias, spec, path.parent) for alias, spec in typed(doc, "models", dict, {}).items()],
        allow=_allow(typed(doc, "allow", dict, {})),
        heartbeat_s=seconds(announce, "heartbeat_s", 900, 1),
        floor_s=seconds(announce, "floor_s", 5, MIN_FLOOR_S),
        queue_depth=bounded(limits, "queue_depth", 4, 0, 1 << 16, "limits"),
        training_jobs=bounded(limits, "training_jobs", 1, 1, 1 << 10, "limits"),
        propagation_node=typed(lxmf, "propagation_node", bool, False),
        lend_mib=_lend_mib(shard),
        shard_threads=bounded(shard, "threads", 0, 0, 1 << 12, "shard"),
        shard_cache_mib=bounded(shard, "cache_mib", 65536, 0, 1 << 30, "shard"),
        shard_yield_idle_s=bounded(shard, "yield_idle_s", 300, 1, 86400, "shard"),
        unreferenced_s=seconds(limits, "unreferenced_s", 86400, 0),
        dataplane=_dataplane(typed(net, "dataplane", str, ""), _table(doc, "train")),
        voice=[parse_voice(alias, spec, path.parent) for alias, spec in typed(doc, "voice", dict, {}).items()],
    )


def _dataplane(value: str, train: Mapping[str, Any]) -> str:
    import ipaddress
    if "dataplane" in train:
        raise ConfigError("[train] dataplane is now [network] dataplane: one address for training and split "
                          "models alike")
    if not value:
        return ""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(f"network.dataplane: {value!r} is not an IP address") from None
    if address.is_unspecified:
        raise ConfigError("network.dataplane: name this tower's one data-plane address, not every interface")
    if address.is_global:
        raise ConfigError(f"network.dataplane: {value} is a public address; gloo/NCCL traffic has no "
                          "authentication, so the data plane must be private (a tailnet or LAN address)")
    return value


def load_network(path: str | os.PathLike[str]) -> NetworkConfig:
    """Read a client config's [network] table; a missing file gives defaults."""
    path = Path(path)
    return _network(_table(read_toml(path), "network") if path.exists() else {})


def write_tower(path: str | os.PathLike[str], name: str, models: Mapping[str, Any], listen: str = "127.0.0.1:4242",
                connect: Iterable[str] = (), allow: Mapping[str, Sequence[str]] | None = None, threads: int = 0,
                network_name: str = "", passphrase: str = "", dataplane: str = "",
                **sections: Mapping[str, Any]) -> None:
    """Write a new tower config. ``models``: {alias: gguf path, or a map of
    [models.X] keys with its "path"}; ``threads``: llama.cpp threads per model
    (0: its default); ``network_name``/``passphrase``: IFAC; ``dataplane``:
    the tower's data-plane address; ``sections``: extra tables, e.g.
    announce={"floor_s": 1}."""
    doc = tomlkit.document()
    doc["name"] = name
    doc["network"] = {"listen": listen, "connect": list(connect),
                      **{k: v for k, v in (("network_name", network_name), ("passphrase", passphrase),
                                           ("dataplane", dataplane)) if v}}
    for key, table in sections.items():
        doc[key] = table
    doc["models"] = {alias: {**({"threads": threads} if threads else {}),
                             **(dict(p, path=str(p["path"])) if isinstance(p, dict) else {"path": str(p)})}
                     for alias, p in models.items()}
    doc["allow"] = dict(allow or {})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_toml(Path(path), doc)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomlkit.parse(path.read_text()).unwrap()
    except (tomlkit.exceptions.TOMLKitError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None


def write_toml(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically, readable by this user only (a config may hold a passphrase)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(tomlkit.dumps(doc))
    os.replace(tmp, path)


def remove_entry(path: Path, table: str, key: str) -> bool:
    """Remove ``key`` from the ``[table]`` of the TOML file at ``path``, keeping
    its comments. Returns True if it was there. Raises OSError (no such file)."""
    doc = tomlkit.parse(path.read_text())
    entries = doc.get(table, {})
    if key not in entries:
        return False
    del entries[key]
    write_toml(path, doc)
    return True



def _network(table: Mapping[str, Any]) -> NetworkConfig:
    if "bitrate" in table:
        raise ConfigError("[network] bitrate is now link_bitrate: it tells RNS the link's speed (MTU, announce "
                          "pacing) and never limited the rate")
    connect = typed(table, "connect", list, [])
    for target in connect:
        parse_hostport(target)
    listen = typed(table, "listen", str, "")
    if listen:
        parse_hostport(listen)
    ifac = {key: typed(table, key, str, "") for key in ("network_name", "passphrase")}
    for key, value in ifac.items():
        if value and not value.isprintable():
            raise ConfigError(f"[network] {key} must be one line of printable text")
    rns_config = typed(table, "rns_config", str, "")
    if rns_config and any(ifac.values()):
        raise ConfigError("[network] network_name and passphrase shape the RNS config rngrid writes; with "
                          "rns_config, set them on that config's interfaces instead")
    return NetworkConfig(listen=listen, connect=connect, rns_config=rns_config,
                         transport=typed(table, "transport", bool, False),
                         link_bitrate=typed(table, "link_bitrate", int, 0), **ifac)



def _model(alias: str, spec: object, base: Path) -> ModelConfig:
    check_alias(alias, "models")
    if not isinstance(spec, dict) or "path" not in spec:
        raise ConfigError(f"models.{alias} needs a path")
    given = typed(spec, "path", str, "")
    path = Path(os.path.expanduser(given))
    if not is_source_ref(given):
        given = str(path if path.is_absolute() else base / path)
    return ModelConfig(alias=alias, path=given,
                       n_ctx=_n_ctx(spec, alias),
                       n_gpu_layers=bounded(spec, "n_gpu_layers", -1, -1, 1 << 16, f"models.{alias}"),
                       threads=bounded(spec, "threads", 0, 0, 1 << 12, f"models.{alias}"),
                       parallel=bounded(spec, "parallel", 0, 0, MAX_PARALLEL, f"models.{alias}"),
                       draft=typed(spec, "draft", str, ""), embeddings=typed(spec, "embeddings", bool, False),
                       preload=typed(spec, "preload", bool, True))


def _n_ctx(spec: Mapping[str, Any], alias: str) -> int:
    value = bounded(spec, "n_ctx", 4096, 0, MAX_N_CTX, f"models.{alias}")
    if value == 1:  # llama-server cannot start with one: its warm-up decodes two tokens
        raise ConfigError(f"models.{alias}.n_ctx = 1 holds no prompt and answer; give 2 or more (0: the model's own)")
    return value


def _table(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{key}] must be a table, got {type(value).__name__}")
    return value




def _lend_mib(table: Mapping[str, Any]) -> int | None:
    if "lend_mib" not in table:
        return None
    value = typed(table, "lend_mib", int, 0)
    if not 0 <= value <= 1 << 24:
        raise ConfigError(f"shard.lend_mib = {value} is outside [0, {1 << 24}]")
    return value


def _allow(table: Mapping[str, Any]) -> dict[str, list[str]]:
    out = {}
    for key, roles in table.items():
        if not isinstance(roles, list) or any(r not in ROLES for r in roles):
            raise ConfigError(f"allow.{key} must be a list of roles from {', '.join(ROLES)}")
        out[identity_hex(key)] = list(roles)
    return out


def identity_hex(value: str) -> str:
    value = value.strip().strip("<>").lower()
    if len(value) != IDENTITY_HASH_HEX or any(c not in "0123456789abcdef" for c in value):
        raise ConfigError(f"{value!r} is not an identity hash ({IDENTITY_HASH_HEX} hex characters)")
    return value


def parse_hostport(text: object) -> tuple[str, int]:
    """'host:port' -> (host, port). Raises ConfigError."""
    if not isinstance(text, str):
        raise ConfigError(f"{text!r} is not host:port")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)
