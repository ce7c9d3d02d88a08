"""The text references of the suite (tests/reference.py) do not depend on what
ran before them: the same request twice in a row on the session's one runner,
the second time right after a shorter run of the same prompt (which, with the
prompt cache on, would leave all but the last prompt token in the KV cache),
gives the same tokens."""

PROMPT = [{"role": "user", "content": "Name three colours of the rainbow and say one thing about each."}]


def test_the_same_request_twice_in_a_row_gives_the_same_tokens(reference):
    first_text, first_ids, _ = reference.run(48, messages=PROMPT)
    reference.run(12, messages=PROMPT)  # the case that once moved the low-order bits of the next run
    second_text, second_ids, _ = reference.run(48, messages=PROMPT)
    assert len(first_ids) == 48
    assert second_ids == first_ids and second_text == first_text


def test_a_completion_reference_is_as_stable_as_a_chat_one(reference):
    prompt = "The three primary colours are"
    assert reference.completion(prompt, 32) == reference.completion(prompt, 32)
