"""Lhotse Shar, written by lhotse's own `SharWriter`: `cuts.000000.jsonl.gz` + `recording.000000.tar`,
... (`lhotse.CutSet.from_shar(in_dir=DEST)` reads them). Each row is a cut of its whole audio
(a MonoCut, or a MultiCut over every channel of a per-speaker row) with one supervision
carrying its text and speaker, and every other metadata column (the id among them) in the
cut's custom fields. The cut's id is `schema.sample_key` (safe as a tar member name).

SharWriter stores the recording re-encoded as FLAC (it decodes and encodes each row: lossless
for chorus's 16-bit FLAC, the same samples). lhotse imports torch: only the Ray task writing a
piece imports it, never the driver.
"""

from __future__ import annotations

import re

from actors import schema as S

from ..names import LHOTSE_EXPORT_RECORD
from .formats import Format, audio_bytes, metadata_rows

CUTS_FILE, RECORDING_FILE = "cuts.jsonl.gz", "recording.tar"
OWNED = re.compile(r"(cuts\.\d{6}\.jsonl\.gz|recording\.\d{6}\.tar)")
# what the supervision carries; the other metadata columns go to the cut's custom fields
_SUPERVISED = (S.TEXT, S.SPEAKER)


def _cut(row: dict, flac: bytes):
    from lhotse import MonoCut, MultiCut, Recording, SupervisionSegment

    key = S.sample_key(row[S.ID])
    recording = Recording.from_bytes(flac, recording_id=key)
    channels = recording.channel_ids
    channel = channels[0] if len(channels) == 1 else list(channels)
    supervision = SupervisionSegment(
        id=key,
        recording_id=key,
        start=0.0,
        duration=recording.duration,
        channel=channel,
        text=row.get(S.TEXT),
        speaker=row.get(S.SPEAKER),
    )
    custom = {k: v for k, v in row.items() if k not in _SUPERVISED}
    kind = MonoCut if len(channels) == 1 else MultiCut
    return kind(
        id=key,
        start=0.0,
        duration=recording.duration,
        channel=channel,
        recording=recording,
        supervisions=[supervision],
        custom=custom,
    )


class SharPiece:
    def __init__(self, folder: str):
        from lhotse.shar import SharWriter

        # shard_size None: one pair of files, named without a number (published numbered)
        self.writer = SharWriter(folder, fields={"recording": "flac"}, shard_size=None)
        self.writer.__enter__()

    def add(self, table) -> None:
        for row, flac in zip(metadata_rows(table), audio_bytes(table).to_pylist()):
            self.writer.write(_cut(row, flac))

    def close(self) -> None:
        self.writer.close()


class LhotseFormat(Format):
    name = "lhotse"
    default_dir = "lhotse"
    # 1,000 cuts per shard: lhotse's own default (CutSet.to_shar, SharWriter)
    shard_rows = 1_000
    shard_bytes = 1_000_000_000
    library = "lhotse"
    columns = [*S.METADATA_COLUMNS, S.AUDIO]
    owned = OWNED
    record_name = LHOTSE_EXPORT_RECORD

    @staticmethod
    def open_piece(folder: str, context) -> SharPiece:
        return SharPiece(folder)

    @staticmethod
    def final_names(number: int, total: int, prefix: str) -> dict:
        return {CUTS_FILE: f"cuts.{number:06d}.jsonl.gz", RECORDING_FILE: f"recording.{number:06d}.tar"}
