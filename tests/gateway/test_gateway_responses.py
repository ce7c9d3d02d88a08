"""OpenAI's Responses API (`POST /v1/responses`) through a real `rngrid serve`
process and a real tower with the bundled model, driven by the real `openai`
package: text whole and streamed (the typed events, through the package's own
stream helper too), a function tool and its output on the next turn (sent
whole and by ``previous_response_id``), a JSON schema answer parsed by
``responses.parse``, logprobs when included; bad input is a 400 in OpenAI's
error shape. The event and object shapes are checked against the package's
own pydantic types."""

import asyncio
import json

import httpx
import openai
import pydantic
import pytest
from openai._models import validate_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from links.wire import Code, WireError
from reticulum_grid.client import Text, ToolCallDelta, Usage
from reticulum_grid.gateway import responses_api
from reticulum_grid.gateway.errors import ApiError
from reticulum_grid.gateway.responses_reply import Turn
from reticulum_grid.gateway.responses_routes import ResponsesRoutes
from reticulum_grid.gateway.responses_store import ResponseStore
from tests.gateway_support import POOL_MODEL, openai_client, served_hearing

MODEL = POOL_MODEL
ASK = "What is the weather in Paris?"
WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}]
FORCED = {"type": "function", "name": "get_weather"}


class Spider(pydantic.BaseModel):
    name: str
    legs: int


@pytest.fixture(scope="module")
def gateway(hub, pool_tower, tmp_path_factory):
    """`rngrid serve` in its own process, as a user runs it, once it has heard the tower."""
    with served_hearing(hub, pool_tower, MODEL, tmp_path_factory.mktemp("responses")) as url:
        yield url


@pytest.fixture
def client(gateway):
    return openai_client(gateway)


def strict(events):
    """Each event validated against openai-python's own types (no field missing or
    mistyped), then fed to its stream helper's state; the state."""
    state = ResponseStreamState(input_tools=openai.NOT_GIVEN, text_format=openai.NOT_GIVEN)
    for event in events:
        state.handle_event(validate_type(type_=ResponseStreamEvent, value=json.loads(json.dumps(event))))
    return state


# -- the shapes, without a tower ----------------------------------------------
def text(piece):
    """A Text piece with its token's logprob and two alternatives, as the tower gives them."""
    out = Text(piece)
    out.logprobs = [{"token": piece, "logprob": -0.5, "bytes": list(piece.encode()),
                     "top": [{"token": "He", "logprob": -0.1, "bytes": [72, 101]},
                             {"token": "H", "logprob": -2.0, "bytes": [72]}]}]
    return out



@pytest.mark.parametrize("finish, last", [("tool_calls", "response.completed"), ("length", "response.incomplete")])
def test_events_and_response_match_openais_types(finish, last):
    turn = Turn(responses_api.parse({"model": "m", "input": "hi", "include": ["message.output_text.logprobs"],
                                     "top_logprobs": 1}, {"m"}))
    events = turn.start() + turn.add(text("Hel")) + turn.add(text("lo")) \
        + turn.add(ToolCallDelta(0, "call_1", "get_weather", '{"city"')) \
        + turn.add(ToolCallDelta(0, arguments=': "Paris"}')) \
        + turn.finish(Usage(prompt_tokens=5, completion_tokens=7, cached_tokens=2, finish_reason=finish, tower="t"))
    assert [e["sequence_number"] for e in events] == list(range(len(events))) and events[-1]["type"] == last
    state = strict(events)
    whole = validate_type(type_=Response, value=json.loads(json.dumps(turn.response())))
    assert whole.output_text == "Hello" and whole.usage.input_tokens_details.cached_tokens == 2
    assert [(t.token, t.top_logprobs[0].token) for t in whole.output[0].content[0].logprobs] == [("Hel", "He"),
                                                                                                 ("lo", "He")]
    [message, call] = whole.output
    assert call.type == "function_call" and call.arguments == '{"city": "Paris"}' and call.call_id == "call_1"
    if finish == "length":  # cut by max_output_tokens: OpenAI's "incomplete", and no response.completed
        assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
        assert message.status == call.status == "incomplete"
    else:
        done = state._completed_response  # what the package's stream helper assembled
        assert whole.status == "completed" and done.output_text == "Hello"
        assert done.output[1].arguments == call.arguments
    assert turn.output_messages() == [{"role": "assistant", "content": "Hello", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]


def test_a_failure_mid_stream_is_an_error_event_then_response_failed():
    """The SSE writer alone, with a named test double for the Grid's events."""
    async def events_double():
        yield Text("late ")
        raise WireError(Code.UNREACHABLE, "tower gone after 1 token")

    async def collect(routes, req):
        events = events_double()
        first = await anext(events)
        return [json.loads(e["data"]) async for e in routes._events(req, Turn(req), first, events)]

    routes, req = ResponsesRoutes(None), responses_api.parse({"model": "m", "input": "hi"}, {"m"})
    events = asyncio.run(collect(routes, req))
    strict(events)
    assert [e["type"] for e in events[-3:]] == ["response.output_text.delta", "error", "response.failed"]
    assert events[-2]["code"] == Code.UNREACHABLE
    assert events[-1]["response"]["error"]["message"] == events[-2]["message"]
    with pytest.raises(ApiError):
        routes.store.get(events[0]["response"]["id"])  # a failed response is not kept


def test_input_items_become_chat_messages():
    req = responses_api.parse({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
        {"type": "message", "role": "user", "content": ASK},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # dropped: no model here reasons in items
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}]}, {"m"})
    assert req.messages() == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use tools."},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]


def test_the_store_is_bounded_and_keeps_a_used_chain():
    store = ResponseStore(max_items=3)
    for rid, previous in (("a", None), ("b", "a"), ("c", None)):
        store.put({"id": rid}, previous, [{"role": "user", "content": rid}])
    assert [m["content"] for m in store.history("b")] == ["a", "b"]  # touches a and b
    store.put({"id": "d"}, None, [])  # the least recently used, c, goes
    with pytest.raises(ApiError) as gone:
        store.history("c")
    assert gone.value.status == 400 and gone.value.param == "previous_response_id"
    store.delete("a")
    with pytest.raises(ApiError):
        store.history("b")  # its first turn is gone: the conversation cannot go on
    assert store.get("b") == {"id": "b"}


# -- the real package, a real `rngrid serve` and a real tower ---------------------
def test_text_whole_and_streamed_is_the_chat_paths_answer(client):
    whole = client.responses.create(model=MODEL, instructions="Answer briefly.", input="Name two planets.",
                                    max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name two planets."}])
    assert whole.output_text == chat.choices[0].message.content and whole.output_text
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert whole.model == MODEL and whole.id.startswith("resp_") and whole.model_extra["rngrid"]["tower"] == "pool"

    events = list(client.responses.create(model=MODEL, instructions="Answer briefly.", input="Name two planets.",
                                          max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    done = events[-1].response
    assert done.output_text == whole.output_text and done.usage.output_tokens == whole.usage.output_tokens
    assert done.usage.input_tokens_details.cached_tokens > 0  # the same prompt again: the runner's cache served it
    assert {e.response.id for e in events if hasattr(e, "response")} == {events[0].response.id}


def test_logprobs_when_included(client):
    include = ["message.output_text.logprobs"]
    whole = client.responses.create(model=MODEL, input="Name two planets.", max_output_tokens=6, temperature=0,
                                    include=include, top_logprobs=2)
    tokens = whole.output[0].content[0].logprobs
    assert "".join(t.token for t in tokens) == whole.output_text and len(tokens) == whole.usage.output_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 and t.bytes for t in tokens)
    events = list(client.responses.create(model=MODEL, input="Name two planets.", max_output_tokens=6, temperature=0,
                                          include=include, top_logprobs=2, stream=True))
    streamed = [t.token for e in events if e.type == "response.output_text.delta" for t in e.logprobs]
    assert streamed == [t.token for t in tokens]
    plain = client.responses.create(model=MODEL, input="Name two planets.", max_output_tokens=2, top_logprobs=2)
    assert plain.output[0].content[0].logprobs == []  # not included: none shown, as OpenAI does


def test_a_function_tool_and_its_output_on_the_next_turn(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=WEATHER, tool_choice=FORCED,
                                    max_output_tokens=40, temperature=0)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert isinstance(json.loads(call.arguments)["city"], str)

    # Streamed through the package's own helper, which checks the events' order and assembles the call.
    with client.responses.stream(model=MODEL, input=ASK, tools=WEATHER, tool_choice=FORCED, max_output_tokens=40,
                                 temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    [streamed] = [item for item in final.output if item.type == "function_call"]
    assert streamed.arguments == call.arguments == "".join(deltas) and streamed.name == "get_weather"

    # The next turn: the whole conversation as input (the output items sent back as they came) ...
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees"}
    whole = client.responses.create(model=MODEL, input=[{"role": "user", "content": ASK}, *first.output, answer],
                                    tools=WEATHER, tool_choice="none", max_output_tokens=16, temperature=0)
    assert whole.output_text and not [i for i in whole.output if i.type == "function_call"]
    # ... or only the tool's output after the stored first turn: the same conversation, the same answer.
    chained = client.responses.create(model=MODEL, previous_response_id=first.id, input=[answer], tools=WEATHER,
                                      tool_choice="none", max_output_tokens=16, temperature=0)
    assert chained.output_text == whole.output_text and chained.previous_response_id == first.id
    assert chained.usage.input_tokens == whole.usage.input_tokens


def test_a_json_schema_answer_parses(client):
    reply = client.responses.parse(model=MODEL, input="Describe a spider as JSON.", text_format=Spider,
                                   max_output_tokens=40, temperature=0)
    assert reply.status == "completed" and isinstance(reply.output_parsed, Spider), reply.output_text
    assert reply.text.format.type == "json_schema" and reply.text.format.name == "Spider"


def test_kept_responses_are_retrieved_and_deleted(client):
    kept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    again = client.responses.retrieve(kept.id)
    assert again.id == kept.id and again.output_text == kept.output_text and again.usage == kept.usage
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    unkept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, previous_response_id=unkept.id)
    assert refused.value.body["param"] == "previous_response_id" and unkept.id in refused.value.body["message"]


@pytest.mark.parametrize("body, param", [
    ({"input": 42}, "input"),
    ({"input": "Hi", "max_output_tokens": "ten"}, "max_output_tokens"),
    ({"input": "Hi", "temperature": 7}, "temperature"),
    ({"input": "Hi", "instructions": ["Be brief."]}, "instructions"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "Hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "Hi", "tools": WEATHER, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"input": "Hi", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "Hi", "background": True}, "background"),
    ({"input": "Hi", "include": ["file_search_call.results"]}, "include"),
    ({"input": "Hi", "top_logprobs": 50}, "top_logprobs"),
    ({"input": "Hi", "previous_response_id": "resp_nothing"}, "previous_response_id"),
    ({"input": "Hi", "bogus": 1}, "bogus"),
])
def test_bad_input_is_a_400_naming_the_field(gateway, body, param):
    reply = httpx.post(gateway + "/v1/responses", json={"model": MODEL, **body}, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"], error
    if param == "bogus":  # OpenAI's own words for a field its Responses API does not define
        assert error["message"] == "Unknown parameter: 'bogus'."


def test_the_package_sees_a_bad_tool_as_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search"}], max_output_tokens=2)
    assert "function" in refused.value.body["message"] and refused.value.body["code"] == "unsupported"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="Hi", max_output_tokens=2)
