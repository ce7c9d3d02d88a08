"""What the tests and the benches both use: the network lab (lab/), what a run needs
beyond the venv (requirements), tiny models, a known dataset, announce arrivals, voice
samples, memory cgroups and the leftover-process check. Not shipped in the wheel;
it imports the product and nothing from tests/ or bench/."""

from pathlib import Path

#: A small chat dataset whose answer no model knows (the secret word): training
#: tests and benches check that an adapter learned it.
SECRET_DATASET = Path(__file__).resolve().parent / "data" / "secret.jsonl"
