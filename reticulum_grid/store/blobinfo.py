"""What the blob store tells of one blob (store/blobstore.py)."""

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BlobInfo:
    """One blob: its id (BLAKE3-256 of its manifest), size (bytes), kind
    (store/names.py's KINDS), aliases, the path of its data when complete
    (``external``: a file registered in place) and, for such a file, why it
    is not served (``problem``)."""
    blob_id: bytes
    size: int
    kind: str
    aliases: list[str] = field(default_factory=list)
    path: Path | None = None
    external: bool = False
    problem: str | None = None  # why a file registered in place is not served (broken())

    @property
    def hex(self) -> str:
        return self.blob_id.hex()
