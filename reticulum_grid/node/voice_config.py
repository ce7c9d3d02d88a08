"""A tower's [voice.ALIAS] tables (node/config.py documents the keys): which voice engines it runs."""

import os
from dataclasses import dataclass
from pathlib import Path

from reticulum_grid.node.config_values import ConfigError, bounded, check_alias, typed

#: Voice engine kinds: speech to text, text to speech.
VOICE_KINDS = ("stt", "tts")


@dataclass
class VoiceConfig:
    """One [voice.ALIAS] table (node/config.py's docstring says what each key means)."""
    alias: str
    kind: str
    path: str = ""
    device: str = "auto"
    threads: int = 0
    language: str = ""
    voice: str = "en-us"


def parse_voice(alias: str, spec: object, base: Path) -> VoiceConfig:
    """A VoiceConfig from the [voice.ALIAS] table ``spec`` (paths relative to ``base``). Raises ConfigError."""
    where = f"voice.{alias}"
    check_alias(alias, "voice")
    if not isinstance(spec, dict):
        raise ConfigError(f"[{where}] must be a table")
    unknown = sorted(set(spec) - {"kind", "path", "device", "threads", "language", "voice"})
    if unknown:
        raise ConfigError(f"[{where}] has unknown key(s): {', '.join(unknown)}")
    kind = typed(spec, "kind", str, "")
    if kind not in VOICE_KINDS:
        raise ConfigError(f"{where}.kind must be stt (speech to text) or tts (text to speech), got {kind!r}")
    device = typed(spec, "device", str, "auto")
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{where}.device must be auto, cpu or cuda, got {device!r}")
    language, voice = typed(spec, "language", str, ""), typed(spec, "voice", str, "en-us")
    for key, value in (("language", language), ("voice", voice)):
        if len(value) > 16 or not all(c.isalnum() or c in "-_+" for c in value):
            raise ConfigError(f"{where}.{key} must be a short language or voice name, got {value!r}")
    path = typed(spec, "path", str, "")
    if path:
        path = os.path.expanduser(path)
        path = path if Path(path).is_absolute() else str(base / path)
    return VoiceConfig(alias=alias, kind=kind, path=path, device=device,
                       threads=bounded(spec, "threads", 0, 0, 1 << 12, where), language=language, voice=voice)
