"""Tool answers of a model whose chat template knows no tools (the bundled
SmolLM2: the tower asks it for one JSON answer, inference/tools.py), through
`rngrid serve` to a real tower, with the real `openai` and `ollama` packages:
an answer cut by max_tokens is plain text or a well-formed partial call on
both APIs, never the grammar's JSON; a streamed answer comes in pieces as it
is written; and an agent loop (the openai package doing it: ask with tools,
run the tool, send its result; and openai-node's own ``runTools`` under Node)
ends with a text answer that uses the result."""

import json
from pathlib import Path

import ollama
import pytest

from tests.gateway_support import FORCED, POOL_MODEL, WEATHER, node_test, openai_client
from testbed.requirements import need

ROOT = Path(__file__).resolve().parents[2]

MODEL = POOL_MODEL
#: A question the model answers in text at temperature 0, tools offered.
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
#: One it answers in text longer than max_tokens (32): a short answer written in
#: a tenth of a second can reach a loaded machine's client as one piece.
LONG_QUESTION = [{"role": "user", "content": "What is the capital of France? Tell me about it."}]
#: One it answers with a call.
TASK = [{"role": "user", "content": "Use the get_weather tool to find the weather in Paris."}]
#: max_tokens that cut a text answer inside its string, and a forced call before and after its name is whole.
CUT_TEXT, CUT_BEFORE_NAME, CUT_IN_ARGUMENTS = 12, 12, 28


@pytest.fixture
def client(pool_gateway):
    return openai_client(pool_gateway)


@pytest.fixture
def olla(pool_gateway):
    return ollama.Client(host=pool_gateway, timeout=120)


def plain(text):
    """True for text without the grammar's JSON in it."""
    return not any(mark in text for mark in ('{"', '"response"', '"tool_c', "tool_call"))


def weather(city):
    """The tool the agent loop runs."""
    return f"Rainy, 14 degrees Celsius in {city}"


def test_a_cut_answer_on_openais_api_is_text_or_a_well_formed_call(client):
    text = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=WEATHER, max_tokens=CUT_TEXT,
                                          temperature=0).choices[0]
    assert text.finish_reason == "length" and not text.message.tool_calls
    assert text.message.content and plain(text.message.content), text.message.content

    early = client.chat.completions.create(model=MODEL, messages=TASK, tools=WEATHER, tool_choice=FORCED,
                                           max_tokens=CUT_BEFORE_NAME, temperature=0).choices[0]
    assert early.finish_reason == "length" and not early.message.tool_calls and not early.message.content, early

    partial = client.chat.completions.create(model=MODEL, messages=TASK, tools=WEATHER, tool_choice=FORCED,
                                             max_tokens=CUT_IN_ARGUMENTS, temperature=0).choices[0]
    [call] = partial.message.tool_calls
    assert partial.finish_reason == "length" and not partial.message.content
    assert call.id and call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)

    # Streamed, the openai package's own helper assembles the same partial call (its
    # get_final_completion() refuses any answer cut by length: the last snapshot is the whole).
    with client.chat.completions.stream(model=MODEL, messages=TASK, tools=WEATHER, tool_choice=FORCED,
                                        max_tokens=CUT_IN_ARGUMENTS, temperature=0) as stream:
        final = [event.snapshot for event in stream if event.type == "chunk"][-1].choices[0]
    [streamed] = final.message.tool_calls
    assert final.finish_reason == "length" and streamed.function.arguments == call.function.arguments


def test_a_cut_answer_on_ollamas_api_is_text_or_a_well_formed_call(olla):
    text = olla.chat(model=MODEL, messages=QUESTION, tools=WEATHER, options={"temperature": 0, "num_predict": CUT_TEXT})
    assert text.done_reason == "length" and not text.message.tool_calls
    assert text.message.content and plain(text.message.content), text.message.content
    pieces = [p.message.content for p in olla.chat(model=MODEL, messages=QUESTION, tools=WEATHER, stream=True,
                                                   options={"temperature": 0, "num_predict": CUT_TEXT})]
    assert "".join(pieces) == text.message.content

    # Ollama has no tool_choice: a call cut in its arguments, asked for in words.
    calls = [c for p in olla.chat(model=MODEL, messages=TASK, tools=WEATHER, stream=True,
                                  options={"temperature": 0, "num_predict": CUT_IN_ARGUMENTS})
             for c in (p.message.tool_calls or ())]
    [call] = calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)


def test_a_streamed_answer_under_tools_comes_in_pieces_as_it_is_written(client, olla):
    chunks = list(client.chat.completions.create(model=MODEL, messages=LONG_QUESTION, tools=WEATHER, max_tokens=32,
                                                 temperature=0, stream=True))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1 and plain("".join(texts)), texts
    whole = client.chat.completions.create(model=MODEL, messages=LONG_QUESTION, tools=WEATHER, max_tokens=32,
                                           temperature=0).choices[0].message.content
    assert "".join(texts) == whole

    pieces = [p.message.content for p in olla.chat(model=MODEL, messages=LONG_QUESTION, tools=WEATHER, stream=True,
                                                   options={"temperature": 0, "num_predict": 32})]
    assert sum(1 for p in pieces if p) > 1 and "".join(pieces) == whole


def agent_loop(client, seed, steps=5):
    """What an agent framework does with the openai package: ask with tools,
    run each call, send the results, until a text answer or ``steps`` asks.
    Returns (the text answer or None when the steps ran out, the calls made)."""
    messages, calls = list(TASK), []
    for _ in range(steps):
        message = client.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER, max_tokens=48,
                                                 temperature=0.8, seed=seed).choices[0].message
        if not message.tool_calls:
            return message.content, calls
        calls += message.tool_calls
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": call.id,
                      "content": weather(**json.loads(call.function.arguments))} for call in message.tool_calls]
    return None, calls


def test_an_agent_loop_ends_with_a_text_answer_that_uses_the_tools_result(client):
    tries = [agent_loop(client, seed) for seed in range(1, 6)]
    print("agent loops (answer, calls):", [(answer, len(calls)) for answer, calls in tries])
    # Each loop ends: a call's result comes back once, then the model answers...
    assert all(answer is not None and len(calls) <= 1 for answer, calls in tries), tries
    # ... and it answers from the result.
    assert sum(1 for answer, calls in tries if calls and "14" in answer and plain(answer)) >= 3, tries


def test_openai_nodes_run_tools_loop_ends_with_the_tools_result(pool_gateway):
    need("node", "openai-node runs under Node.js")
    need("node-packages", "openai-node")
    run = node_test("runtools.test.mjs", RNGRID_URL=pool_gateway, RNGRID_MODEL=MODEL)
    assert run.returncode == 0 and "# pass 1" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
