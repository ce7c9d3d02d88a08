"""Every command a tower serves, once: its path and what both ends must know of it.

The table is the one list of commands. A tower's capability modules attach
their handlers to these entries (``Command.bind``; tower/daemon.py merges
them and refuses a path twice, one outside this table, or one left without a
handler); the client reads the wire properties (which commands it may send
again, node/connection.py); the gateway's ``/v1/grid/execute``, ``rngrid
execute`` and docs/protocol.md list the ``user`` ones (tests/wire/test_commands.py
checks that they agree). Adding a command: an entry here, a handler in its
capability's ``commands()``, then ``python scripts/docs_tables.py`` for the
docs' table; the gateway and the CLI take a plain request/reply command as it is.

Audiences: ``user`` commands are what an application calls (``Grid.execute``,
``/v1/grid/execute``, ``rngrid execute``); ``client`` commands are steps the
Grid client takes itself (a ping, a blob transfer, a probe for split
planning); ``tower`` commands are sent by one tower to another.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

USER, CLIENT, TOWER = "user", "client", "tower"
#: A handler: ``handler(session, request map) -> reply map``; raises WireError.
Handler = Callable[[Any, dict], dict]
#: A role name, several any of which will do, or None (anyone, identified or not).
Role = str | tuple[str, ...] | None


@dataclass(frozen=True)
class Command:
    """One request path on a tower's destination.

    ``role``: what the caller needs (links/auth.py). ``summary``: one line
    for people (help text, docs/protocol.md). ``answered_once``: the name of the
    random id field its requests carry; a repeat of the same bytes on a Link
    gets the first reply and starts nothing new (tower/replies.py), so it may
    be sent again. ``resendable``: it changes nothing on the tower, so a lost
    request or reply is made good by sending it again. ``handler``: set on
    the tower only (``bind``)."""

    path: str
    role: Role
    summary: str
    audience: str = USER
    answered_once: str | None = None
    resendable: bool = False
    handler: Handler | None = field(default=None, compare=False, repr=False)

    def bind(self, handler: Handler) -> "Command":
        """This command with the tower's ``handler`` attached."""
        return replace(self, handler=handler)

    @property
    def roles(self) -> tuple[str, ...]:
        """The role names that allow it (empty: anyone)."""
        return () if self.role is None else self.role if isinstance(self.role, tuple) else (self.role,)

    @property
    def may_resend(self) -> bool:
        """True when sending it again cannot do anything twice."""
        return self.resendable or self.answered_once is not None


_TABLE = (
    Command("ping", None, "an empty reply: its round trip is the client's RTT to the tower", CLIENT, resendable=True),
    Command("caps/full", None, "the tower's caps, blobs, GPUs, voice engines and the caller's roles", resendable=True),
    Command("ai/inference", "infer", "stream a model's answer to a prompt or chat", answered_once="stream_id"),
    Command("ai/embeddings", "infer", "embedding vectors of texts"),
    Command("audio/transcribe", ("voice", "infer"), "stream the transcript of audio, segment by segment",
            answered_once="stream_id"),
    Command("audio/speech", ("voice", "infer"), "speak text into audio", answered_once="stream_id"),
    Command("blobs/manifest", "sync", "a blob's manifest, size, kind and aliases", CLIENT, resendable=True),
    Command("blobs/push", ("sync", "train"), "send a blob to the tower (a trainer sends its dataset)", CLIENT),
    Command("blobs/pull", "sync", "have the tower fetch a blob from other towers", CLIENT),
    Command("genome/train", "train", "start a LoRA training job", answered_once="submit_id"),
    Command("jobs/status", "train", "the caller's training jobs (an admin sees all)", resendable=True),
    Command("jobs/watch", "train", "a training job's events until it ends"),
    Command("jobs/cancel", "train", "cancel a training job (its owner or an admin)"),
    Command("train/join", "train-peer", "enlist the tower as a rank of a multi-tower training job", TOWER),
    Command("shard/tunnel", "shard", "carry llama.cpp RPC to the tower's RPC server for a split model", TOWER),
    Command("shard/seed", "shard", "fill the tower's RPC tensor cache from its own copy of a model", TOWER,
            resendable=True),
    Command("split/probe", "infer", "the tower's round trips to other towers, for planning a split", CLIENT),
)
#: Every command, by path.
COMMANDS: dict[str, Command] = {c.path: c for c in _TABLE}
#: Commands answered once per distinct request on a Link, and their id field.
ANSWERED_ONCE: dict[str, str] = {c.path: c.answered_once for c in _TABLE if c.answered_once}
#: Commands a client may send again when no reply came.
RESENDABLE: frozenset[str] = frozenset(c.path for c in _TABLE if c.may_resend)


def command(path: str) -> Command:
    """The table's entry for ``path``. Raises KeyError naming the known paths."""
    try:
        return COMMANDS[path]
    except KeyError:
        raise KeyError(f"no command {path!r} in links/commands.py; known: {', '.join(COMMANDS)}") from None


def bind(path: str, handler: Handler) -> Command:
    """The entry for ``path`` with ``handler`` attached (what a capability's ``commands()`` returns)."""
    return command(path).bind(handler)


def of(audience: str) -> list[Command]:
    """The commands for ``audience`` (USER, CLIENT or TOWER), in table order."""
    return [c for c in _TABLE if c.audience == audience]


def by_role(commands: Iterable[Command] = _TABLE) -> dict[str, list[str]]:
    """{role: [path, ...]}: what each role lets its holder call."""
    found: dict[str, list[str]] = {}
    for c in commands:
        for role in c.roles:
            found.setdefault(role, []).append(c.path)
    return found
