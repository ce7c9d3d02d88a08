"""What agent clients send, through `rngrid serve` to a real tower, with the real
`openai` package: tools with a forced function (whole and streamed, in OpenAI's
shape, and the tool's answer sent back), JSON schema answers, embeddings
(floats, base64, shortened), logprobs (chat and completions), penalties; what
still cannot run is a 400 naming the field; the command API carries the same."""

import json
import math

import httpx
import openai
import pytest

from tests.gateway_support import FORCED, POOL_MODEL, WEATHER, openai_client

MODEL = POOL_MODEL
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SPIDER = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
          "required": ["name", "legs"], "additionalProperties": False}


@pytest.fixture
def client(pool_gateway):
    return openai_client(pool_gateway)


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_a_forced_tool_call_comes_back_in_openais_shape(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, tool_choice=FORCED,
                                           max_tokens=60, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)

    # Streamed: tool_calls deltas, assembled by the openai package's own stream helper.
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=WEATHER, tool_choice=FORCED, max_tokens=60,
                                        temperature=0) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas and deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 for d in deltas)
    [streamed] = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert streamed.function.name == "get_weather" and streamed.function.arguments == call.function.arguments

    # The call and the tool's answer go back in the history; the model answers in text.
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees"}]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=WEATHER, tool_choice="none",
                                            max_tokens=24, temperature=0)
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in ("stop", "length")


def test_a_json_schema_answer_parses_and_validates(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a spider as JSON."}], max_tokens=60,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "spider", "schema": SPIDER}})
    answer = json.loads(reply.choices[0].message.content)
    assert set(answer) == {"name", "legs"} and isinstance(answer["name"], str) and isinstance(answer["legs"], int)
    anything = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object with one key, the name of a cat."}],
        max_tokens=120, temperature=0, response_format={"type": "json_object"})
    assert anything.choices[0].finish_reason == "stop", anything.choices[0].message.content
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_embeddings_as_floats_base64_and_shortened(client):
    texts = ["The sea is salty.", "The sea is salty.", "Tax forms are due in April."]
    packed = client.embeddings.create(model=MODEL, input=texts)  # the openai package asks for base64 and decodes it
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2] and len(floats.data[0].embedding) == 576
    assert floats.usage.prompt_tokens > 0 and floats.model == MODEL
    assert cosine(floats.data[0].embedding, floats.data[1].embedding) == pytest.approx(1.0, abs=1e-6)
    assert cosine(floats.data[0].embedding, floats.data[2].embedding) < 0.999
    for a, b in zip(packed.data, floats.data):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)  # float32 either way
    short = client.embeddings.create(model=MODEL, input="The sea is salty.", dimensions=64, encoding_format="float")
    assert len(short.data[0].embedding) == 64
    assert math.sqrt(sum(x * x for x in short.data[0].embedding)) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input="x", dimensions=5000)
    assert refused.value.body["param"] == "dimensions"


def test_logprobs_in_chat_and_completions_shapes(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0, logprobs=True,
                                           top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 8
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
               for t in content)
    streamed = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0,
                                                   logprobs=True, top_logprobs=3, stream=True))
    tokens = [t.token for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert "".join(tokens) == reply.choices[0].message.content

    text = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
                                     logprobs=2)
    lp = text.choices[0].logprobs
    assert "".join(lp.tokens) == text.choices[0].text and len(lp.tokens) == 6
    assert all(p <= 0 for p in lp.token_logprobs) and all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].logprobs is None


def test_presence_and_frequency_penalties_reach_the_tower(client):
    count = [{"role": "user", "content": "Repeat the word 'yes' twenty times."}]
    plain = client.chat.completions.create(model=MODEL, messages=count, max_tokens=30, temperature=0)
    penalised = client.chat.completions.create(model=MODEL, messages=count, max_tokens=30, temperature=0,
                                               presence_penalty=2.0, frequency_penalty=2.0)
    assert penalised.choices[0].message.content != plain.choices[0].message.content


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("logit_bias", {"42": 10}), ("functions", [{"name": "f"}]),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
    ("tools", [{"type": "custom", "custom": {"name": "f"}}]), ("top_logprobs", 50),
    ("tool_choice", "required"), ("response_format", {"type": "xml"}),
])
def test_what_still_cannot_run_is_a_400_naming_the_field(client, field, value):
    request = {"model": MODEL, "messages": ASK, "max_tokens": 4, field: value}
    if field == "top_logprobs":
        request["logprobs"] = True
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**request)
    assert refused.value.body["param"].startswith(field), refused.value.body


def test_unknown_paths_are_named(pool_gateway):
    missing = httpx.post(pool_gateway + "/v1/chat/complete", json={})
    assert missing.status_code == 404 and "/v1/chat/complete" in missing.json()["error"]["message"]
    wrong = httpx.get(pool_gateway + "/v1/embeddings")
    assert wrong.status_code == 405 and "GET /v1/embeddings" in wrong.json()["error"]["message"]


def execute(url, command, params):
    reply = httpx.post(url + "/v1/grid/execute", json={"command": command, "params": params}, timeout=120)
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines() if line]


def test_the_command_api_carries_tool_calls_logprobs_and_embeddings(pool_gateway):
    events = execute(pool_gateway, "ai/inference", {"model": MODEL, "messages": ASK, "tools": WEATHER,
                                               "tool_choice": FORCED, "max_tokens": 60, "temperature": 0})
    calls = [e for e in events if e["type"] == "tool_call"]
    assert calls and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads("".join(c["arguments"] for c in calls))["city"]
    assert events[-1]["type"] == "usage" and events[-1]["finish_reason"] == "tool_calls"
    events = execute(pool_gateway, "ai/inference", {"model": MODEL, "prompt": "The sky is", "max_tokens": 4,
                                               "temperature": 0, "logprobs": True, "top_logprobs": 2})
    probs = [p for e in events if e["type"] == "token" for p in e.get("logprobs", ())]
    assert len(probs) == 4 and all(p["logprob"] <= 0 and len(p["top"]) == 2 for p in probs)
    [embedded] = execute(pool_gateway, "ai/embeddings", {"model": MODEL, "input": ["a", "b"]})
    assert embedded["type"] == "embeddings" and embedded["dims"] == 576 and len(embedded["vectors"]) == 2
