"""``POST /v1/grid/execute``: the grid's own commands from any language.

Body ``{"command": str, "params": {...}}``; the answer is the command's
events, one JSON object per line (NDJSON), or SSE ``data:`` lines when the
request accepts ``text/event-stream``. Every event has a ``type``:

- ``ai/inference`` (params: the Grid's inference payload, inference/request.py:
  ``tools``, ``tool_choice``, ``response_format``, ``logprobs`` too; plus
  ``tower``): ``token`` {text, logprobs?: [{token, logprob, bytes, top}]} and
  ``tool_call`` {index, id, name, arguments: the next piece of the call's JSON
  arguments} ..., then ``usage``: the fields of client.Usage (links/usage.py's
  StreamUsage: prompt_tokens, completion_tokens, tower_ttft_s, tokens_per_s,
  queued_s, tower, ...; plus the client's ttft_s, finish_reason ("tool_calls"
  after a call) and failovers).
- ``ai/embeddings`` {model, input: str | [str], tower?}: ``embeddings``
  {vectors: [[float]], dims, prompt_tokens, tower}.
- ``genome/train`` (params: the job request, see training/request.py, with the
  data as ``dataset`` (a blob on the tower), ``data`` (JSONL text) or
  ``examples`` (a list of {"messages": [...]} or {"text": ...}); ``tower``
  (default auto); ``watch`` (default true)): ``transfer`` {done_bytes,
  total_bytes} while the data is sent, ``job`` {job_id, tower}, then the job's
  events (``state``, ``started``, ``progress`` {step, total_steps, loss, lr,
  tokens_per_s, eta_s}, ``end`` {state, final_loss, adapter_alias, ...}).
- ``audio/transcribe``, ``audio/speech``: see audio.command_work.
- ``jobs/watch`` {job_id, tower?}: the job's events until ``end``.
- ``jobs/status`` {job_id?, tower?}: ``jobs`` {jobs: [job + tower]}.
- ``jobs/cancel`` {job_id, tower?}: ``status`` {job}.
- ``caps/full`` {tower}: ``result`` {reply}.
- ``grid/towers``, ``grid/models``: ``towers`` {towers}, ``models`` {models}.

An error before the first event is an HTTP error (errors.py) whose
``error.code`` is the grid's code; after it, one ``error`` event {code,
message, retry_after} ends the stream. Either way the codes are the Grid's.
"""

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from links import commands
from links.wire import Code, WireError, json_safe
from reticulum_grid.client import Grid
from reticulum_grid.gateway.bridge import Reporter, Work, relay
from reticulum_grid.gateway.errors import bad_request
from reticulum_grid.gateway.inference import Event, embeddings_event, inference_events
from reticulum_grid.gateway.views import Views
from reticulum_grid.training.request import TrainRequest

#: genome/train params that are not part of the tower's job request.
TRAIN_LOCAL = ("data", "examples", "tower", "watch")
#: The gateway's own commands, beside the towers' user commands (links/commands.py).
LOCAL = {"grid/towers": "towers heard: hops, age, backend, memory, models, load, tokens/s, RTT",
         "grid/models": "every model and adapter a live tower holds"}


def known() -> list[str]:
    """Every command /v1/grid/execute (and ``rngrid execute``) runs: the towers'
    user commands, in the table's order, then LOCAL."""
    return [c.path for c in commands.of(commands.USER)] + list(LOCAL)


#: What work_for returns: ``work(call)``, emitting the command's events on ``call`` (bridge.Call).
CommandWork = Work[Event]
#: A WORK builder: (grid, views, command, params, tower, busy_wait_s) -> its work. Raises ApiError(400).
Builder = Callable[[Grid, Views, str, dict[str, Any], str | None, float], CommandWork]


def work_for(grid: Grid, views: Views, command: str, params: object, busy_wait_s: float) -> CommandWork:
    """``work(call)`` (bridge.Call) for one command. A user command of
    links/commands.py without a builder in WORK answers its tower's reply
    map as one ``result`` event {reply} (it needs ``tower``). Raises
    ApiError(400) for a bad command or params."""
    if not isinstance(params, dict):
        raise bad_request("'params' must be an object", "params")
    tower = params.get("tower")
    if tower is not None and not isinstance(tower, str):
        raise bad_request("'tower' must be a tower name or destination hash", "params.tower")
    if command not in known():
        raise bad_request(f"unknown command {command!r}; known: {', '.join(known())}", "command")
    return WORK.get(command, _reply)(grid, views, command, params, tower, busy_wait_s)


def _inference(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
               busy_wait_s: float) -> CommandWork:
    payload = {k: v for k, v in params.items() if k != "tower"}
    if not isinstance(payload.get("model"), str):
        raise bad_request("ai/inference needs params.model", "params.model")
    return inference_events(grid, payload, tower, busy_wait_s)


def _embeddings(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
                busy_wait_s: float) -> CommandWork:
    if not isinstance(params.get("model"), str):
        raise bad_request("ai/embeddings needs params.model", "params.model")
    texts = params.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise bad_request("ai/embeddings needs params.input: a string or a list of them", "params.input")
    return embeddings_event(grid, params["model"], texts, tower, busy_wait_s)


def _audio(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
           busy_wait_s: float) -> CommandWork:
    from reticulum_grid.gateway import audio  # its HTTP routes need starlette; rngrid execute may lack it
    return audio.command_work(grid, command, params, busy_wait_s)


def _jobs(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
          busy_wait_s: float) -> CommandWork:
    if command == "jobs/status" and params.get("job_id") is None:
        return lambda call: call.emit({"type": "jobs", "jobs": _all_jobs(grid, views, tower)})
    if not isinstance(params.get("job_id"), str):
        raise bad_request(f"{command} needs params.job_id", "params.job_id")
    return lambda call: _job(grid, command, params["job_id"], tower, call)


def _reply(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
           busy_wait_s: float) -> CommandWork:
    if not tower:
        raise bad_request(f"{command} needs params.tower", "params.tower")
    payload = {k: v for k, v in params.items() if k != "tower"}
    return lambda call: call.emit({"type": "result", "reply": json_safe(grid.execute(command, payload, tower=tower))})


def _training(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
              busy_wait_s: float) -> CommandWork:
    return lambda call: _train(grid, params, call)


def _towers(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
            busy_wait_s: float) -> CommandWork:
    return lambda call: call.emit({"type": "towers", "towers": views.towers()})


def _models(grid: Grid, views: Views, command: str, params: dict[str, Any], tower: str | None,
            busy_wait_s: float) -> CommandWork:
    return lambda call: call.emit({"type": "models", "models": views.models()})


#: Commands whose events are more than their tower's reply map.
WORK: dict[str, Builder] = {
    "ai/inference": _inference, "ai/embeddings": _embeddings, "audio/transcribe": _audio, "audio/speech": _audio,
    "genome/train": _training, "jobs/status": _jobs, "jobs/watch": _jobs, "jobs/cancel": _jobs,
    "grid/towers": _towers, "grid/models": _models}


def _all_jobs(grid: Grid, views: Views, tower: str | None) -> list[dict[str, Any]]:
    if tower:
        return [{"tower": name, **job} for name, job in grid.jobs(tower)]
    return views.jobs(fresh=True)


def _job(grid: Grid, command: str, job_id: str, tower: str | None, call: Reporter[Event]) -> None:
    entry = grid.job_tower(job_id, tower)
    if command == "jobs/status":
        reply = grid.connection(entry).request("jobs/status", {"job_id": job_id})
        call.emit({"type": "jobs", "jobs": [{"tower": entry.name, **job} for job in reply["jobs"]]})
    elif command == "jobs/cancel":
        call.emit({"type": "status", "job": {"tower": entry.name, **grid.cancel_job(job_id, entry.name)}})
    else:
        _follow(grid.watch(job_id, entry.name), call)


def _follow(events: Iterator[dict[str, Any]], call: Reporter[Event]) -> None:
    """Emit a job's events until its end, or until the client leaves (the job
    keeps running, only the watching stops)."""
    # Grid.watch's hint says Iterator; it is a generator, whose close() ends the watch on the tower.
    relay(events, call, json_safe)


def _train(grid: Grid, params: dict[str, Any], call: Reporter[Event]) -> None:
    asked = TrainRequest.from_map({k: v for k, v in params.items() if k not in TRAIN_LOCAL})
    data_path = _data_file(grid, params)

    def progress(done: int, total: int) -> None:
        call.emit({"type": "transfer", "done_bytes": done, "total_bytes": total})

    entry, job_id = grid.train(asked, data_path, params.get("tower"), progress)
    call.emit({"type": "job", "job_id": job_id, "tower": entry.name})
    if params.get("watch", True) and not call.stopped.is_set():
        _follow(grid.watch(job_id, entry.name), call)


def _data_file(grid: Grid, params: dict[str, Any]) -> Path | None:
    """A JSONL file in the client's home from ``data`` or ``examples`` (None for
    neither), named by its content: the client's blob store refers to it in
    place, so it stays. Raises WireError(bad_request)."""
    data, examples = params.get("data"), params.get("examples")
    if data is None and examples is None:
        return None
    if data is not None and examples is not None:
        raise WireError(Code.BAD_REQUEST, "give 'data' or 'examples', not both")
    if examples is not None:
        if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
            raise WireError(Code.BAD_REQUEST, "'examples' must be a list of objects")
        data = "".join(json.dumps(e) + "\n" for e in examples)
    if not isinstance(data, str) or not data.strip():
        raise WireError(Code.BAD_REQUEST, "'data' must be JSONL text")
    raw = data.encode("utf-8")
    path = grid.home / "datasets" / f"{hashlib.sha256(raw).hexdigest()[:32]}.jsonl"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        partial = path.with_suffix(".part")
        partial.write_bytes(raw)
        partial.replace(path)  # whole or absent: a crash never leaves half a dataset under its final name
    return path
