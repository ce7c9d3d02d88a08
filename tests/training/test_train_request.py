"""The genome/train request (training/request.py's TrainRequest): checked once
when it is made, frozen, the same map on the wire both ways. The tower's side
of it runs against a real tower in tests/training/test_train.py."""

import copy
import dataclasses

import pytest

from links.wire import Code, WireError
from reticulum_grid.training.request import MAX_TOWERS, TrainRequest
from testbed import SECRET_DATASET as DATA

BASE = {"base": "smollm2-135m", "dataset": "secret", "output_alias": "secret-lora"}
TOWER_A, TOWER_B = "ab" * 16, "cd" * 16


def test_defaults_and_the_wire_map_round_trip():
    asked = TrainRequest.from_map({**BASE, "max_steps": 16, "alpha": 32, "notify": "<" + "0f" * 16 + ">",
                                   "towers": [TOWER_A.upper(), TOWER_A, TOWER_B], "submit_id": 7})
    assert asked.rank == 8 and asked.alpha == 32.0 and isinstance(asked.alpha, float)
    assert asked.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert asked.notify == b"\x0f" * 16, "hex notify is read as the address it means"
    assert asked.towers == (TOWER_A, TOWER_B), "upper case and repeats are read as one tower"
    wire = asked.to_map()
    assert wire["target_modules"] == list(asked.target_modules) and wire["towers"] == [TOWER_A, TOWER_B]
    assert "epochs" not in wire and "dataset" in wire
    assert TrainRequest.from_map(wire) == asked


@pytest.mark.parametrize("change, words", [
    ({"base": None}, "missing field 'base'"),
    ({"output_alias": None}, "missing field 'output_alias'"),
    ({"rank": 0}, "field 'rank'"),
    ({"rank": True}, "got bool"),
    ({"alpha": "16"}, "field 'alpha' must be float"),
    ({"learning_rate": 2.0}, "learning_rate"),
    ({"epochs": 1, "max_steps": 5}, "epochs or max_steps, not both"),
    ({"target_modules": []}, "target_modules"),
    ({"target_modules": [1]}, "must be strings"),
    ({"target_modules": ["lm_head"]}, "only linear layers"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"use_dora": True}, "DoRA"),
    ({"output_alias": "../x"}, "alias"),
    ({"notify": "xyz"}, "LXMF address"),
    ({"notify": b"\x00" * 3}, "LXMF address"),
    ({"towers": ["zz" * 16]}, "not hex"),
    ({"towers": [TOWER_A], "batch_size": 1}, "batch_size of at least the number of towers"),
    ({"towers": [f"{i:032x}" for i in range(MAX_TOWERS)]}, "towers"),
    ({"dataset": "x" * 129}, "dataset"),
    ({"colour": "red"}, "unknown field(s): colour"),
])
def test_bad_input_is_a_clear_error_and_the_map_is_left_as_it_was(change, words):
    raw = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    before = copy.deepcopy(raw)
    with pytest.raises(WireError) as e:
        TrainRequest.from_map(raw)
    assert e.value.code == Code.BAD_REQUEST and words in e.value.message, e.value
    assert raw == before, "a refused request must not be changed"


def test_a_map_that_is_not_a_map_is_refused():
    with pytest.raises(WireError, match="is a map"):
        TrainRequest.from_map(["base"])  # type: ignore[arg-type]


def test_it_is_frozen_and_a_changed_copy_is_checked_again():
    asked = TrainRequest.from_map(BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        asked.rank = 4  # type: ignore[misc]
    assert dataclasses.replace(asked, rank=4).rank == 4 and asked.rank == 8
    with pytest.raises(WireError, match="rank"):
        dataclasses.replace(asked, rank=0)
    with pytest.raises(WireError, match="LXMF address"):
        dataclasses.replace(asked, notify="0f" * 16)  # type: ignore[arg-type]  # made in code: must be bytes
    with pytest.raises(WireError, match="distinct lower-case"):
        dataclasses.replace(asked, towers=(TOWER_A.upper(),))


def test_made_in_code_it_is_checked_too():
    with pytest.raises(WireError, match="field 'seq_len'"):
        TrainRequest(base="m", output_alias="o", seq_len=4)
    with pytest.raises(WireError, match="only linear layers"):
        TrainRequest(base="m", output_alias="o", target_modules=("embed_tokens",))


def test_job_spec_is_a_new_map_and_the_request_stays():
    asked = TrainRequest.from_map({**BASE, "notify": b"\x01" * 16, "towers": [TOWER_A], "submit_id": 9})
    spec = asked.job_spec(base_path="/m.gguf", dataset_path="/d.jsonl")
    assert spec["epochs"] == 1 and spec["max_steps"] is None, "no length given: one epoch"
    assert spec["base_path"] == "/m.gguf" and spec["target_modules"] == list(asked.target_modules)
    assert not {"notify", "towers", "submit_id"} & set(spec), "they stay with the request"
    spec["rank"] = 99
    assert asked.rank == 8 and asked.job_spec()["rank"] == 8
    steps = TrainRequest.from_map({**BASE, "max_steps": 3}).job_spec()
    assert steps["max_steps"] == 3 and steps["epochs"] is None


def test_what_only_the_tower_can_check(tmp_path):
    asked = TrainRequest.from_map({**BASE, "target_modules": ["q_proj", "q_porj"]})
    with pytest.raises(WireError, match="unknown target module 'q_porj'"):
        asked.check_on({"q_proj", "v_proj"}, DATA)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"messages": "not a list"}\n')
    with pytest.raises(WireError, match="line 2"):
        TrainRequest.from_map(BASE).check_on({"q_proj", "k_proj", "v_proj", "o_proj"}, bad)
    TrainRequest.from_map(BASE).check_on({"q_proj", "k_proj", "v_proj", "o_proj"}, DATA)
