"""``rngrid demo``: a tower and a client on loopback, a real model, a streamed answer.

Everything lives in a fresh temporary directory and is removed afterwards;
only 127.0.0.1 is used.
"""

import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reticulum_grid.node import identity, rnsnet
from reticulum_grid.client import Grid, Usage
from reticulum_grid.inference.default_model import DEFAULT_ALIAS, default_model_path
from reticulum_grid.node.localgrid import TowerProcess, trust_local_towers


def run_demo(prompt: str, max_tokens: int, out: Console, err: Console, temperature: float = 0.7) -> None:
    with tempfile.TemporaryDirectory(prefix="rngrid-demo-") as tmp:
        client_home = Path(tmp) / "client"
        client_id = identity.load_or_create(client_home / "identity").hash.hex()
        tower = TowerProcess(tmp, "demo-tower", {DEFAULT_ALIAS: default_model_path()},
                             allow={client_id: ["infer"]})
        err.print(f"starting tower process (config {tower.config_path}) ...")
        # The demo's client trusts its own tower; with a tower of your own, run on the laptop:
        err.print(f"this client trusts it, as on a laptop: {tower.trust_line()}")
        trust_local_towers(client_home)
        tower.start()
        try:
            _client(prompt, max_tokens, temperature, client_home, tower, out, err)
        finally:
            # RNS saves its tables at exit: do it now, while its directory still
            # exists, and detach before the tower goes so nothing tries to reconnect.
            rnsnet.stop()
            tower.stop()
            err.print("tower stopped.")


def _client(prompt: str, max_tokens: int, temperature: float, client_home: Path, tower: TowerProcess, out: Console,
            err: Console) -> None:
    grid = Grid(home=client_home, connect=[tower.address])
    started = time.monotonic()
    entry = grid.route(DEFAULT_ALIAS, timeout=120)
    # ``out`` and ``err`` (the CLI's consoles) show every string as plain text: a name is never markup.
    err.print(f"heard tower {entry.name} <{entry.hash_hex}> after {time.monotonic() - started:.1f} s")
    table = Table("tower", "backend", "device", "RAM free", "models", "tokens/s")
    hw = entry.caps.hardware
    table.add_row(entry.name, hw.backend, hw.device, f"{hw.ram_free_mib} MiB",
                  ", ".join(m.alias for m in entry.caps.models), f"{entry.caps.tokens_per_s:.0f}")
    err.print(table)
    err.print(f"you: {prompt}")
    err.print(f"{DEFAULT_ALIAS}@{entry.name}: ", end="")
    stream = grid.execute("ai/inference", {"model": DEFAULT_ALIAS, "max_tokens": max_tokens, "temperature": temperature,
                                           "messages": [{"role": "user", "content": prompt}]})
    for piece in stream:
        if isinstance(piece, Usage):
            print(flush=True)
            err.print(f"TTFT {piece.ttft_s * 1000:.0f} ms (tower {piece.tower_ttft_s * 1000:.0f} ms), "
                      f"{piece.tokens_per_s:.1f} tokens/s, {piece.completion_tokens} tokens, "
                      f"finish: {piece.finish_reason}")
        else:
            out.print(piece, end="", soft_wrap=True)
    grid.close()
