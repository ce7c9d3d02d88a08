"""What each tower says about the blobs it holds: its caps/full rows
(announce/capsfull.BlobFacts, decoded there, trusting nothing), each with
the name this client knows the tower by. ``Grid.tower_models(entries)`` asks
the towers.
"""

from dataclasses import dataclass, fields

from announce.capsfull import BlobFacts


@dataclass(frozen=True)
class TowerModel(BlobFacts):
    """One blob on one tower: the tower's caps/full row (BlobFacts: where a
    loaded model sits, its slots, what it is) and ``tower``, its name here."""
    tower: str = ""

    @classmethod
    def of(cls, tower: str, blob: BlobFacts) -> "TowerModel":
        return cls(tower=tower, **{f.name: getattr(blob, f.name) for f in fields(BlobFacts)})
