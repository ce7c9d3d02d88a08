"""Tool calls for a template without tools (inference/tools.py), without a
model: the JSON answer read as it grows (text out piece by piece, a call's
head early and its arguments at the end, a cut answer never its JSON), and the
prompt after a tool's result (results beside the question, a tool that
answered not offered again in the same turn). The real model's side is in
tests/gateway/test_gateway_agents.py and tests/gateway/test_gateway_tool_answers.py."""

import json

import pytest

from reticulum_grid.inference import tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "Rainy, 14 degrees"}


def fed(text, step=1):
    """(text given out, deltas, Answer) from ``text`` fed ``step`` characters at a time."""
    answer, out, deltas = tools.Answer(), [], []
    for i in range(0, len(text), step):
        piece, calls = answer.feed(text[i:i + step])
        out.append(piece)
        deltas += calls
    return out, deltas, answer


def test_a_text_answer_comes_out_as_it_is_written_escapes_decoded():
    written = '{ "response" : "Caf\\u00e9 \\"Chez\\" \\ud83d\\ude00\\nau revoir" }'
    pieces, deltas, answer = fed(written)
    assert "".join(pieces) == 'Café "Chez" 😀\nau revoir' and not deltas
    assert sum(1 for p in pieces if p) > 10, "the text came out in pieces, not at the end"
    assert answer.end() == ("", []) and not answer.called


@pytest.mark.parametrize("cut", [1, 5, 14, 16, 20, 21, 22, 30])
def test_a_cut_text_answer_gives_the_text_so_far_and_never_json(cut):
    written = '{"response": "Paris is \\u00e9t\\u00e9 nice"}'
    pieces, deltas, answer = fed(written[:cut])
    tail, calls = answer.end()
    text = "".join(pieces) + tail
    assert "Paris is été nice".startswith(text) and not deltas + calls
    assert "{" not in text and '"' not in text


def test_a_call_gives_its_head_when_its_name_is_whole_and_its_arguments_at_the_end():
    written = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    name_done = written.index('", "arguments"') + 1
    pieces, deltas, answer = fed(written[:name_done - 1])
    assert not deltas, "a name may still grow until its quote closes"
    more, head = answer.feed(written[name_done - 1:name_done])
    [head] = head
    assert head["id"].startswith("call_") and head["function"] == {"name": "get_weather", "arguments": ""}
    rest, calls = answer.feed(written[name_done:])
    assert not "".join(pieces) + more + rest and not calls
    text, [last] = answer.end()
    assert not text and last["index"] == 0 and json.loads(last["function"]["arguments"]) == {"city": "Paris"}
    assert answer.called


@pytest.mark.parametrize("cut, arguments", [
    ('{"tool_call": {"name": "get_weather", "argu', {}),
    ('{"tool_call": {"name": "get_weather", "arguments": {"ci', {}),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Par', {"city": "Par"}),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3', {"city": "Paris", "days": 3}),
])
def test_a_cut_call_is_a_well_formed_call_with_the_arguments_so_far(cut, arguments):
    _, deltas, answer = fed(cut, step=3)
    _, end = answer.end()
    assert [d["function"].get("name") for d in deltas + end] == ["get_weather", None]
    assert json.loads("".join(d["function"]["arguments"] for d in deltas + end)) == arguments


@pytest.mark.parametrize("cut", ['{"tool_c', '{"tool_call": {"name": "get_wea', '{', ''])
def test_an_answer_cut_before_it_says_what_it_is_gives_nothing(cut):
    pieces, deltas, answer = fed(cut)
    assert answer.end() == ("", []) and not "".join(pieces) and not deltas and not answer.called


def test_a_lone_surrogate_escape_does_not_lose_the_rest_of_a_whole_answer():
    # The grammar allows any \\uXXXX; jiter refuses a lone surrogate, Python's reader takes it.
    pieces, _, answer = fed('{"response": "ab\\ud800cd"}')
    text = "".join(pieces) + answer.end()[0]
    assert text.startswith("ab") and text.endswith("cd") and len(text) == 5


def test_tool_results_go_beside_the_question_and_calls_are_not_replayed():
    messages, _ = tools.prompt([{"role": "system", "content": "Be brief."}, ASK, CALL, RESULT], [WEATHER, CLOCK],
                               "auto")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n") and "get_time" in messages[0]["content"]
    assert messages[1]["content"] == "What is the weather in Paris?\n\nThe get_weather tool says: Rainy, 14 degrees"


def allowed(schema):
    """The answers a schema allows: tool names, and "response" for a text answer."""
    return [s["properties"]["tool_call"]["properties"]["name"]["const"] if "tool_call" in s["properties"]
            else "response" for s in schema.get("anyOf", [schema])]


def test_a_tool_that_answered_in_this_turn_is_not_offered_again():
    history = [ASK, CALL, RESULT]
    assert allowed(tools.prompt([ASK], [WEATHER, CLOCK], "auto")[1]) == ["get_weather", "get_time", "response"]
    messages, schema = tools.prompt(history, [WEATHER, CLOCK], "auto")
    assert allowed(schema) == ["get_time", "response"] and "get_weather" not in messages[0]["content"]
    # Every tool answered: a text answer from the results, nothing else.
    messages, schema = tools.prompt(history, [WEATHER], None)
    assert allowed(schema) == ["response"] and messages[0]["content"] == tools.ANSWER_INSTRUCTION
    # A new question offers every tool again; earlier results stay beside the earlier question.
    later = history + [{"role": "assistant", "content": "Rainy."}, {"role": "user", "content": "And tomorrow?"}]
    messages, schema = tools.prompt(later, [WEATHER], "auto")
    assert allowed(schema) == ["get_weather", "response"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "tool says" in messages[1]["content"] and messages[3]["content"] == "And tomorrow?"


def test_a_forced_function_stays_forced_after_its_result():
    forced = {"type": "function", "function": {"name": "get_weather"}}
    assert allowed(tools.prompt([ASK, CALL, RESULT], [WEATHER, CLOCK], forced)[1]) == ["get_weather"]


def test_results_of_several_calls_and_words_between_them_keep_their_order():
    two = {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]}
    three = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c4", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Nice"}'}}]}
    history = [ASK, CALL, RESULT, two, {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
               {"role": "tool", "tool_call_id": "c3", "content": "Sunny"}, three,
               {"role": "tool", "tool_call_id": "c4", "content": "Windy"}, {"role": "tool", "name": "other", "content": "x"}]
    messages, _ = tools.prompt(history, [WEATHER, CLOCK], "auto")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"].endswith("\n\nThe get_weather tool says: Rainy, 14 degrees")
    assert messages[2]["content"] == "Let me look."
    # One run of results, across a call without words; arguments where one tool answered twice.
    assert messages[3]["content"] == ('The get_time tool says: 09:00\nThe get_weather tool says, for {"city": "Lyon"}: '
                                      'Sunny\nThe get_weather tool says, for {"city": "Nice"}: Windy\n'
                                      'The other tool says: x')
