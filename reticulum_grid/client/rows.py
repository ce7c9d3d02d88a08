"""One tower's row, as ``rngrid towers`` prints it and the gateway serves it
(``/v1/grid/towers``, the dashboard): a JSON map built from the tower table's
entry and what this client measured of it."""

from announce.caps import Caps, Hardware
from announce.table import TowerEntry
from reticulum_grid.client.router import Health


def tower_row(entry: TowerEntry, health: Health | None) -> dict:
    """A tower's row from its table entry and its Health (None for a tower
    this client does not trust, so never asked). Keys: name, destination,
    hops, age_s (seconds since heard); trusted, state ("ok", "silent",
    "failed", "not asked" or "untrusted"), error, rtt_ms, backed_off;
    backend, device, gpus, memory {kind "VRAM"/"RAM", free_mib, total_mib},
    vram_free_mib, vram_total_mib, ram_free_mib, ram_total_mib (MiB);
    models [{alias, blob, loaded}], adapters [{alias, blob}], voice [{alias,
    kind stt/tts, language, realtime (x), free}]; load {streams, queue,
    jobs}; tokens_per_s."""
    return {"name": entry.name, "destination": entry.hash_hex, "hops": entry.hops, "age_s": round(entry.age(), 1),
            **_standing(health), **_hardware(entry.caps.hardware), **_holdings(entry.caps)}


def _standing(health: Health | None) -> dict:
    if health is None:
        return {"trusted": False, "state": "untrusted", "error": "", "rtt_ms": 0.0, "backed_off": False}
    return {"trusted": True, "state": health.state or "not asked", "error": health.error,
            "rtt_ms": round(health.rtt_s * 1000, 1), "backed_off": health.backed_off()}


def _hardware(hw: Hardware) -> dict:
    return {"backend": hw.backend, "device": hw.device, "gpus": hw.gpus,
            "memory": {"kind": "VRAM" if hw.vram_total_mib else "RAM", "free_mib": hw.memory_free_mib,
                       "total_mib": hw.memory_total_mib},
            "vram_free_mib": hw.vram_free_mib, "vram_total_mib": hw.vram_total_mib,
            "ram_free_mib": hw.ram_free_mib, "ram_total_mib": hw.ram_total_mib}


def _holdings(caps: Caps) -> dict:
    return {"models": [{"alias": m.alias, "blob": m.short_hex, "loaded": m.loaded} for m in caps.models],
            "adapters": [{"alias": a.alias, "blob": a.short_hex} for a in caps.adapters],
            "voice": [{"alias": v.alias, "kind": v.kind, "language": v.language, "realtime": v.realtime,
                       "free": v.free} for v in caps.voice],
            "load": {"streams": caps.load.streams, "queue": caps.load.queue, "jobs": caps.load.jobs},
            "tokens_per_s": caps.tokens_per_s}
