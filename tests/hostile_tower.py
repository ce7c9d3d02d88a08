"""A hostile tower for the trust tests: the real ``rngrid tower``, lying in its
announce and caps (another tower's name, an absurd tokens/s, memory it does not
lend: its RPC server's real cap can be made smaller with ``--rpc-headroom-mib``), optionally
slow, inflating the token counts in its stream (each chunk's ``n`` and the
end's usage, ``--inflate-n``), answering chosen commands with an error message of its choice (terminal
escapes, markup), and writing down every ``ai/inference`` request that
reaches it (before its own allow-list is asked: a prompt a tower refuses has
still been sent to it).

Run: ``python -m tests.hostile_tower [--claim-name N] [--claim-tokens-per-s X]
[--claim-lend-mib M] [--rpc-headroom-mib H] [--token-delay S] [--inflate-n F] [--refuse PATH=MESSAGE] --record FILE -- -v tower --config tower.toml``.
``HostileTower`` is a TowerProcess that runs it.
"""

import argparse
import dataclasses
import json
import sys
import time

import msgpack

from reticulum_grid.node.localgrid import TowerProcess


class HostileTower(TowerProcess):
    """``claim``: {"name": str, "tokens_per_s": float, "lend_mib": int}; ``rpc_headroom_mib``:
    what its RPC server may hold beyond the memory it really lends (split/rpcworker.py's
    RPC_HEADROOM_MIB; None: that); ``token_delay``: seconds
    added after every token; ``inflate_n``: each chunk says it stands for this
    many times the tokens it does, and the end's usage claims as many tokens and
    ``claim``'s tokens/s; ``record``: where its received prompts go (JSON lines).
    Untrusted unless ``trusted=True``."""

    def __init__(self, root, name, models, claim=None, token_delay=0.0, inflate_n=1, refuse=None, trusted=False,
                 rpc_headroom_mib=None, **kwargs):
        super().__init__(root, name, models, trusted=trusted, **kwargs)
        self.claim = claim or {}
        self.rpc_headroom_mib = rpc_headroom_mib
        self.token_delay = token_delay
        self.inflate_n = inflate_n
        self.refuse = refuse or {}  # {command path: error message it answers with}
        self.record = self.dir / "received.jsonl"

    def argv(self):
        flags = ["--record", str(self.record), "--token-delay", str(self.token_delay), "--inflate-n",
                 str(self.inflate_n)]
        if "name" in self.claim:
            flags += ["--claim-name", self.claim["name"]]
        if "tokens_per_s" in self.claim:
            flags += ["--claim-tokens-per-s", str(self.claim["tokens_per_s"])]
        if "lend_mib" in self.claim:
            flags += ["--claim-lend-mib", str(self.claim["lend_mib"])]
        if self.rpc_headroom_mib is not None:
            flags += ["--rpc-headroom-mib", str(self.rpc_headroom_mib)]
        for path, message in self.refuse.items():
            flags += ["--refuse", f"{path}={message}"]
        return [sys.executable, "-m", "tests.hostile_tower", *flags, "--", *super().argv()[3:]]

    def received(self):
        """The prompts (message contents or raw prompt) of every ai/inference request it got."""
        if not self.record.exists():
            return []
        return [json.loads(line)["text"] for line in self.record.read_text().splitlines() if line]


def _patch(args):
    from links import wire
    from reticulum_grid.split import rpcworker
    from reticulum_grid.tower import daemon, inference

    if args.rpc_headroom_mib is not None:
        rpcworker.RPC_HEADROOM_MIB = args.rpc_headroom_mib
    real_caps, real_handler = daemon.Tower.caps, daemon.Tower._handler
    real_usage, real_start = inference.TowerInference.usage, inference.start_stream
    claims = {k: v for k, v in (("name", args.claim_name), ("tokens_per_s", args.claim_tokens_per_s),
                                ("lend_mib", args.claim_lend_mib)) if v is not None}
    refusals = dict(item.split("=", 1) for item in args.refuse)

    def caps(self):
        return dataclasses.replace(real_caps(self), **claims)

    def usage(self, result, queued_s):
        usage = real_usage(self, result, queued_s)
        if args.inflate_n > 1:
            usage = dataclasses.replace(usage, completion_tokens=usage.completion_tokens * args.inflate_n,
                                        tokens_per_s=claims.get("tokens_per_s", usage.tokens_per_s))
        return dataclasses.replace(usage, tower=args.claim_name) if args.claim_name else usage

    def handler(self, command):
        handle, path = real_handler(self, command), command.path
        if path in refusals:  # RNS reads a handler's signature: six named parameters
            return lambda _path, data, request_id, link_id, identity, at: wire.error("internal", refusals[path])
        if path != "ai/inference":
            return handle

        def recording(_path, data, request_id, link_id, remote_identity, requested_at):
            try:
                request = msgpack.unpackb(data, raw=False)
                text = request.get("prompt") or " ".join(m.get("content", "") for m in request.get("messages", []))
            except Exception as e:  # noqa: BLE001 (record whatever came)
                text = f"<undecodable: {e}>"
            with open(args.record, "a") as f:
                f.write(json.dumps({"text": text}) + "\n")
            return handle(_path, data, request_id, link_id, remote_identity, requested_at)

        return recording

    def start_stream(session, request, queue, generate, *rest, **kwargs):
        def lying(prepared, result, cancel):
            for piece in generate(prepared, result, cancel):
                time.sleep(args.token_delay)
                # n differs from the ids now, so the chunk carries it (tower/streams.py _extra).
                yield dataclasses.replace(piece, n=piece.n * args.inflate_n)

        altered = args.token_delay or args.inflate_n > 1
        return real_start(session, request, queue, lying if altered else generate, *rest, **kwargs)

    daemon.Tower.caps, daemon.Tower._handler = caps, handler
    inference.TowerInference.usage, inference.start_stream = usage, start_stream


def main():
    parser = argparse.ArgumentParser(prog="hostile_tower")
    parser.add_argument("--claim-name", default=None)
    parser.add_argument("--claim-tokens-per-s", type=float, default=None)
    parser.add_argument("--claim-lend-mib", type=int, default=None)
    parser.add_argument("--rpc-headroom-mib", type=int, default=None)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--inflate-n", type=int, default=1)
    parser.add_argument("--refuse", action="append", default=[], metavar="PATH=MESSAGE")
    parser.add_argument("--record", required=True)
    parser.add_argument("rngrid", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    _patch(args)
    from reticulum_grid.cli import main as cli
    sys.argv = ["rngrid", *[a for a in args.rngrid if a != "--"]]
    cli()


if __name__ == "__main__":
    main()
