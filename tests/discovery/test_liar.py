"""A trusted tower that lies about its speed wins one request at most: routing ranks
by what the client measured (router.py), counted by the client itself (TokenEvent.counted)
and kept in its home across processes (client/measured.py).

Real tower processes on loopback: an honest tower and a trusted liar (tests/hostile_tower.py:
the real tower, altered) that announces 1,000 tokens/s, streams slowly and says every chunk
stands for 50 times the tokens it carries. Requests go through separate `rngrid infer`
processes sharing one client home, and through the gateway. Then the units: a
corrupt, oversized or hostile measured-rates file, the count a chunk is believed for, and the
claim bound by the kind's measured rate.
"""

import json
import os

import httpx
import pytest

from announce import caps as c
from announce.table import TowerEntry
from links.stream import TokenEvent
from reticulum_grid.client import measured, router
from reticulum_grid.client.measured import MeasuredRates
from reticulum_grid.inference.default_model import default_model_path
from reticulum_grid.inference.placement import LoadError
from reticulum_grid.node.identity import load_or_create
from reticulum_grid.split import supervisor
from tests.conftest import rngrid
from tests.gateway_support import serve
from tests.hostile_tower import HostileTower

ALIAS = "liar-model"  # only this module's towers have it
REQUESTS = 8
LIE = 1000.0  # tokens/s the liar announces (an honest tower here announces tens)


def payload(n):
    return {"model": ALIAS, "prompt": f"Count: {n},", "max_tokens": 10, "temperature": 0.0}


@pytest.fixture(scope="module")
def towers(hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("liar-cli")
    cli_id = load_or_create(home / "identity").hash.hex()
    models = {ALIAS: default_model_path()}
    allow = {hub.grid.identity_hash: ["infer"], cli_id: ["infer"]}
    honest = hub.start_tower("liar-honest", models=models, allow=allow)
    liar = HostileTower(hub.root, "liar-liar", models, claim={"tokens_per_s": LIE}, token_delay=0.25, inflate_n=50,
                        trusted=True, allow=allow, connect=[hub.address]).start()
    hub.towers.append(liar)
    assert len(hub.grid.caps_full([hub.wait_tower("liar-honest"), hub.wait_tower("liar-liar")], timeout=60)) == 2
    # The honest tower has run something, so it announces its rate (a fresh tower announces 0).
    list(hub.grid.execute("ai/inference", payload("warm"), tower="liar-honest"))
    yield honest, liar, home
    hub.stop_towers([honest, liar])


def route(home, honest, liar):
    run = rngrid("route", "-m", ALIAS, "--json", "--connect", honest.address, "--connect", liar.address, home=home)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[0])


def test_a_lying_tower_wins_at_most_one_of_eight_cli_requests(towers):
    honest, liar, home = towers
    (home / measured.FILE).write_bytes(b"\x00{not json")  # a corrupt file costs nothing but its figures
    first = route(home, honest, liar)
    print(f"nothing measured: {[(r['tower'], r['tokens_per_s'], r['believed_tokens_per_s']) for r in first]}")
    assert first[0]["tower"] == "liar-liar", "with nothing measured the liar's claim should rank first"
    served = []
    for n in range(REQUESTS):
        run = rngrid("infer", "-m", ALIAS, "--raw", "--max-tokens", "10", "--temperature", "0", "--json",
                     "--connect", honest.address, "--connect", liar.address, f"Count: {n},", home=home)
        assert run.returncode == 0, run.stderr[-2000:]
        served.append([json.loads(line)["usage"] for line in run.stdout.splitlines() if '"usage"' in line][0]["tower"])
    after = route(home, honest, liar)
    print(f"served: {served}; then: {[(r['tower'], r['believed_tokens_per_s'], r['measured']) for r in after]}")
    assert served.count("liar-liar") <= 1, served
    assert after[0]["tower"] == "liar-honest" and all(r["measured"] for r in after)
    liar_row = next(r for r in after if r["tower"] == "liar-liar")
    assert liar_row["believed_tokens_per_s"] < 10 < LIE == liar_row["tokens_per_s"]  # 4 tokens/s at most
    kept = json.loads((home / measured.FILE).read_text())
    assert kept["version"] == measured.VERSION and len(kept["towers"]) == 2
    assert (home / measured.FILE).stat().st_mode & 0o077 == 0


def test_a_lying_tower_that_inflates_its_counts_wins_at_most_one_of_eight_gateway_requests(hub, towers):
    liar_entry, honest_entry = hub.wait_tower("liar-liar"), hub.wait_tower("liar-honest")
    if hub.grid.health.get(liar_entry.destination_hash).tokens_per_s == 0:  # never streamed from it here yet
        # Believed faster, not ranked first: on a CPU the two costs a token differ by a few ms, which
        # the RTTs in a rank (tens of ms on a loaded machine) may outweigh.
        believe = hub.grid.health.believed_tokens_per_s
        assert believe(liar_entry.destination_hash, liar_entry.caps) > believe(
            honest_entry.destination_hash, honest_entry.caps), "the liar's claim should be believed while unmeasured"
    served = []
    with serve(hub, busy_wait_s=30) as url:
        for n in range(REQUESTS):
            reply = httpx.post(url + "/v1/completions", json=payload(n), timeout=120)
            assert reply.status_code == 200, reply.text
            served.append(reply.json()["rngrid"]["tower"])
    believed = hub.grid.health.believed_tokens_per_s(liar_entry.destination_hash, liar_entry.caps)
    print(f"served: {served}; the liar measured at {believed:.1f} tokens/s, announcing {liar_entry.caps.tokens_per_s}")
    assert served.count("liar-liar") <= 1, served
    assert believed < 10  # its chunks said 50 times more: the client counted what arrived


# -- units ------------------------------------------------------------------------


def test_a_corrupt_measured_rates_file_is_tolerated(tmp_path):
    path = tmp_path / measured.FILE
    key, other = b"\x01" * 16, b"\x02" * 16
    for junk in (b"\x00\xff{", b"[1, 2]", b'{"version": 1, "towers": []}', b"9" * 100 + b"e999999",
                 b"[" * 100000, json.dumps({"version": 1, "towers": {"zz": {}, key.hex(): {"tokens_per_s": "fast"},
                                                                     other.hex(): {"tokens_per_s": float("nan")}}}).encode()):
        path.write_bytes(junk)
        rates = MeasuredRates(path)
        assert rates.towers() == {}, junk[:40]
        rates.record(key, "cpu/x", 12.5)
        assert MeasuredRates(path).get(key).tokens_per_s == 12.5
    path.write_bytes(b" " * (measured.MAX_FILE_BYTES + 1))
    assert MeasuredRates(path).towers() == {}
    # One bad entry costs only itself.
    good = {"tokens_per_s": 3.0, "kind": "cpu/x", "at": 1e12, "lend_failed_mib": 0}
    path.write_text(json.dumps({"version": 1, "towers": {key.hex(): good, other.hex(): {**good, "at": -1}}}))
    assert set(MeasuredRates(path).towers()) == {key}


def test_measured_rates_are_shared_bounded_and_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / measured.FILE
    a, b = MeasuredRates(path), MeasuredRates(path)  # two processes sharing one home
    a.record(b"\x01" * 16, "cpu/x", 10.0)
    b.record(b"\x02" * 16, "cpu/x", 20.0)  # re-reads first: a's figure stays
    assert set(MeasuredRates(path).towers()) == {b"\x01" * 16, b"\x02" * 16}
    assert MeasuredRates(path).best_of_kind("cpu/x") == 20.0 and MeasuredRates(path).best_of_kind("cuda/y") == 0.0
    monkeypatch.setattr(measured, "MAX_TOWERS", 5)
    for i in range(12):
        a.record(bytes([i + 10]) * 16, "cpu/x", 1.0)
    assert len(MeasuredRates(path).towers()) == 5 and not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    os.chmod(tmp_path, 0o500)  # a home it cannot write: figures stay in memory, nothing raises
    try:
        a.record(b"\x03" * 16, "cpu/x", 7.0)
        assert a.get(b"\x03" * 16).tokens_per_s == 7.0
    finally:
        os.chmod(tmp_path, 0o700)


def test_a_chunk_counts_what_arrived_not_what_the_tower_says():
    assert TokenEvent(b"Hello world", [9906, 1917], {"n": 1000}).counted == 2
    assert TokenEvent(b"ab", [1, 2, 3, 4, 5, 6], {}).counted == 2  # ids padded beyond its text
    assert TokenEvent("\u00e9".encode(), [233], {"n": 2}).counted == 1  # a character of two tokens, one id back
    assert TokenEvent(b"x" * 9, [], {"n": 100, "x": True}).counted == 3  # no ids: 4 bytes a token
    assert TokenEvent(b"", [], {"n": 1, "tc": [{"index": 0}]}).counted == 0
    assert TokenEvent(b"Hello world", [9906, 1917], {}).counted == 2


def entry(name, tps, device="box"):
    caps = c.Caps(name=name, hardware=c.Hardware("cpu", device, 0, 0, 64000, 8000),
                  models=(c.ModelCap("m", b"abcd", True),), tokens_per_s=tps)
    return TowerEntry(name.encode().ljust(16, b"\0"), caps, 1, 0.0)


def test_a_claim_is_bounded_by_what_its_kind_was_measured_at():
    honest, liar, other = entry("honest", 40.0), entry("liar", 1000.0), entry("other", 1000.0, device="elsewhere")
    book = router.HealthBook()
    assert router.choose([honest, liar], "m", health=book).name == "liar"  # nothing measured: the claim wins
    book.measured(liar.destination_hash, 4.0, liar.caps.hardware)  # it streamed slowly
    assert book.believed_tokens_per_s(honest.destination_hash, honest.caps) == 8.0  # 2 x the best of its kind
    assert router.choose([honest, liar], "m", health=book).name == "honest"
    assert book.believed_tokens_per_s(other.destination_hash, other.caps) == 1000.0  # another kind: its prior
    book.measured(honest.destination_hash, 30.0, honest.caps.hardware)
    fresh = entry("fresh-liar", 1000.0)
    assert book.believed_tokens_per_s(fresh.destination_hash, fresh.caps) == 60.0
    reloaded = router.HealthBook(book.rates)
    assert reloaded.get(liar.destination_hash).tokens_per_s == 4.0


def test_a_tower_known_faster_than_every_tower_heard_is_waited_for(tmp_path):
    """A fresh `rngrid` process goes with the towers heard first: the liar above
    answered the ping before the honest tower and won a second request, once when
    the honest tower was measured, once when it had only been heard. A trusted
    tower this client measured, or heard announcing, faster than every candidate
    heard is waited for (Grid._discover_for, at most ANSWER_S after the ping);
    one not trusted, or slower, is not."""
    honest, liar, stranger = entry("honest", 40.0), entry("liar", 1000.0), entry("stranger", 40.0)
    book = router.HealthBook()
    book.measured(liar.destination_hash, 4.0, liar.caps.hardware)
    book.measured(honest.destination_hash, 50.0, honest.caps.hardware)
    book.measured(stranger.destination_hash, 90.0, stranger.caps.hardware)
    trusted = {honest.destination_hash, liar.destination_hash}.__contains__
    assert book.faster_unheard([liar], [liar.destination_hash], trusted) == {honest.destination_hash}
    assert book.faster_unheard([liar], [liar.destination_hash, honest.destination_hash], trusted) == set()
    assert book.faster_unheard([honest], [honest.destination_hash], trusted) == set()  # the liar is slower
    assert book.faster_unheard([liar], [liar.destination_hash], lambda h: True) == {
        honest.destination_hash, stranger.destination_hash}
    # Heard once, never measured: its claim counts as an unmeasured tower's would (at most 2 x 4 tokens/s).
    book = router.HealthBook(MeasuredRates(tmp_path / measured.FILE))
    book.heard([honest, liar])
    book.measured(liar.destination_hash, 4.0, liar.caps.hardware)
    later = router.HealthBook(MeasuredRates(tmp_path / measured.FILE))  # the next process sharing the home
    assert later.faster_unheard([liar], [liar.destination_hash], trusted) == {honest.destination_hash}
    assert later.faster_unheard([honest], [honest.destination_hash], trusted) == set()
    slow = entry("slow", 3.0)
    later.heard([slow])
    assert later.faster_unheard([liar], [liar.destination_hash, honest.destination_hash], lambda h: True) == set()
    # Hearing a measured tower again keeps its figure's age: it is forgotten MAX_AGE_S after it was measured.
    measured_at = later.rates.get(liar.destination_hash).at
    later.heard([entry("liar", 900.0)])
    assert later.rates.get(liar.destination_hash).at == measured_at
    assert MeasuredRates(tmp_path / measured.FILE).get(liar.destination_hash).announced == 900.0


def test_a_lend_claim_is_bounded_by_the_part_that_failed_there():
    book = router.HealthBook()
    liar = c.Caps(name="liar", lend_mib=190)
    key = b"\x07" * 16
    assert book.believed_lend_mib(key, liar) == 190 and book.believed_lend_mib(key, c.Caps(name="none")) is None
    book.rates.lend_failed(key, 158)
    assert book.believed_lend_mib(key, liar) == 79
    book.rates.lend_failed(key, 300)  # a larger failure says less: the smallest is kept
    assert book.believed_lend_mib(key, liar) == 79
    book.rates.lend_held(key, 60)  # a smaller part held: the failure above it stands
    assert book.believed_lend_mib(key, liar) == 79
    book.rates.lend_held(key, 158)
    assert book.believed_lend_mib(key, liar) == 190


def test_the_worker_whose_memory_ran_out_is_named_from_llama_cpps_own_words():
    log_text = ("llama_model_load: error loading model: unable to allocate RPC0[127.0.0.1:40123] buffer\n"
                "llama_model_load_from_file_impl: failed to load model\n")
    error = LoadError("llama-server exited while loading", log_text)
    assert error.out_of_memory and error.buffer == "RPC0[127.0.0.1:40123]"
    assert LoadError("x", "unable to allocate CPU buffer").buffer == "CPU" and LoadError("x", "").buffer == ""
    key = b"\x0a" * 16
    assert supervisor.named_worker(f"no tower could run 'm'; tried a: insufficient_memory: "
                                   f"{supervisor.naming_worker(key, 'the split model did not load')}") == key
    assert supervisor.named_worker("the split model did not load") is None
