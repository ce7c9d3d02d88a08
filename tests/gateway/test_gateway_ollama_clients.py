"""Ollama's API as clients other than the `ollama` package speak it, against
`rngrid serve` in its own process and a real tower with the real model:
litellm's ``ollama_chat/`` and ``ollama/`` routes (their POSTs carry no
Content-Type), and the npm ``ollama-ai-provider-v2`` with Vercel's ``ai``
under Node.js (OpenAI's sampling fields beside Ollama's; an embed reply its
schema checks). The npm packages come from tests/node/package.json."""

import json
import os
from pathlib import Path

# litellm fetches its model price list from the web at import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import pytest  # noqa: E402

from reticulum_grid.client import Usage  # noqa: E402
from tests.gateway_support import POOL_MODEL, WEATHER, node_test, served_hearing  # noqa: E402
from testbed.requirements import need  # noqa: E402

#: litellm's own types trip pydantic's warnings at import; they say nothing about the gateway.
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")
ROOT = Path(__file__).resolve().parents[2]
MODEL = POOL_MODEL
CHAT = [{"role": "user", "content": "Name two planets."}]


@pytest.fixture(scope="module")
def served(hub, pool_tower, tmp_path_factory):
    """The URL of `rngrid serve` (its own process, as a user runs it) once it has heard the tower."""
    with served_hearing(hub, pool_tower, MODEL, tmp_path_factory.mktemp("ollama-clients")) as url:
        yield url


def grid_text(hub, max_tokens):
    pieces = list(hub.grid.execute("ai/inference", {"model": MODEL, "messages": CHAT, "temperature": 0.0,
                                                    "max_tokens": max_tokens}))
    assert isinstance(pieces[-1], Usage)
    return "".join(pieces[:-1])


def test_litellm_ollama_chat_whole_and_streamed(hub, served):
    whole = litellm.completion(model=f"ollama_chat/{MODEL}", api_base=served, messages=CHAT, temperature=0,
                               max_tokens=16)
    assert whole.choices[0].message.content == grid_text(hub, 16)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 16
    chunks = list(litellm.completion(model=f"ollama_chat/{MODEL}", api_base=served, messages=CHAT, temperature=0,
                                     max_tokens=16, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content and len(chunks) > 3  # as it came, not all at once


def test_litellm_ollama_chat_tools(served):
    ask = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]
    reply = litellm.completion(model=f"ollama_chat/{MODEL}", api_base=served, messages=ask, tools=WEATHER,
                               temperature=0, max_tokens=60)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    history = ask + [reply.choices[0].message.model_dump(),
                     {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": "Sunny, 24 degrees"}]
    answer = litellm.completion(model=f"ollama_chat/{MODEL}", api_base=served, messages=history, temperature=0,
                                max_tokens=24)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_litellm_ollama_generate(served):
    reply = litellm.completion(model=f"ollama/{MODEL}", api_base=served, messages=CHAT, temperature=0, max_tokens=12)
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 12


def test_npm_ollama_provider_chat_and_embed(served):
    need("node", "the npm provider runs under Node.js")
    need("node-packages", "the npm provider and the ai package")
    run = node_test("ollama_provider.test.mjs", RNGRID_URL=served, RNGRID_MODEL=MODEL)
    assert run.returncode == 0 and "# fail 0" in run.stdout and "# pass 3" in run.stdout, \
        run.stdout[-4000:] + run.stderr[-2000:]
