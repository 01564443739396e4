"""Lhotse Shar: `cuts.000000.jsonl.gz` + `recording.000000.tar`, ... (with export.splits, each
split's in `<split>/`; `lhotse.CutSet.from_shar(in_dir=DEST)` or `in_dir=DEST/<split>` reads them).
Each row is a cut of its whole audio (a MonoCut, or a MultiCut over every channel of a
per-speaker row) with one supervision carrying its text, speaker and language (asr_language),
and the other export.columns (the id among them) in the cut's custom fields. The cut's id is
`schema.sample_key` (safe as a tar member name).

The FLAC bytes go into the tar as the output stores them, not decoded and encoded again:
written with lhotse's own pieces -- its TarWriter for `<key>.flac` and `<key>.json` (the
recording's Shar placeholder, `to_shar_placeholder`, as its AudioTarWriter writes it) and its
JsonlShardWriter for the cuts -- instead of SharWriter, which decodes every row and encodes it
anew. No index files are written (lhotse releases that index Shar by default are told not to:
`create_index=False` where the writers take it); the tested lhotse range is pinned in
pyproject.toml. lhotse imports torch: only the Ray task writing a piece imports it, never the
driver.
"""

from __future__ import annotations

import codecs
import inspect
import json
import re
from io import BytesIO

from actors import schema as S

from ..names import LHOTSE_EXPORT_RECORD
from .formats import Format, audio_bytes, metadata_rows

CUTS_FILE, RECORDING_FILE = "cuts.jsonl.gz", "recording.tar"
OWNED = re.compile(r"([A-Za-z0-9][A-Za-z0-9_]*/)?(cuts\.\d{6}\.jsonl\.gz|recording\.\d{6}\.tar)")
# what the supervision carries; the other exported columns go to the cut's custom fields
_SUPERVISED = (S.TEXT, S.SPEAKER, S.ASR_LANGUAGE)


def _cut(row: dict, recording):
    from lhotse import MonoCut, MultiCut, SupervisionSegment

    key = recording.id
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
        language=row.get(S.ASR_LANGUAGE),
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


def _placeholder(key: str, flac: bytes):
    """The recording's Shar placeholder (what lhotse's `to_shar_placeholder` makes of
    `Recording.from_bytes`: one `shar` source over every channel), from the FLAC's header alone."""
    import soundfile as sf
    from lhotse import AudioSource, Recording

    info = sf.info(BytesIO(flac))
    channels = list(range(info.channels))
    return Recording(
        id=key,
        sources=[AudioSource(type="shar", channels=channels, source="")],
        sampling_rate=info.samplerate,
        num_samples=info.frames,
        duration=info.frames / info.samplerate,
        channel_ids=channels,
    )


def _without_index(writer_class, *args):
    """A lhotse writer, told not to write index files where it can be (newer releases)."""
    if "create_index" in inspect.signature(writer_class).parameters:
        return writer_class(*args, shard_size=None, create_index=False)
    return writer_class(*args, shard_size=None)


class SharPiece:
    def __init__(self, folder: str, columns: list):
        from lhotse.shar.writers import JsonlShardWriter, TarWriter

        self.columns = columns
        # shard_size None: one pair of files, named without a number (published numbered)
        self.tar = _without_index(TarWriter, f"{folder}/{RECORDING_FILE}")
        self.cuts = _without_index(JsonlShardWriter, f"{folder}/{CUTS_FILE}")
        self.tar.__enter__()
        self.cuts.__enter__()

    def add(self, table) -> None:
        for row, flac in zip(metadata_rows(table, self.columns), audio_bytes(table).to_pylist()):
            key = S.sample_key(row[S.ID])
            placeholder = _placeholder(key, flac)
            self.tar.write(f"{key}.flac", BytesIO(flac))
            manifest = BytesIO()
            print(json.dumps(placeholder.to_dict()), file=codecs.getwriter("utf-8")(manifest))
            self.tar.write(f"{key}.json", manifest, count=False)
            self.cuts.write(_cut(row, placeholder))

    def close(self) -> None:
        self.tar.close()
        self.cuts.close()


class LhotseFormat(Format):
    name = "lhotse"
    default_dir = "lhotse"
    # 1,000 cuts per shard: lhotse's own default (CutSet.to_shar, SharWriter)
    shard_rows = 1_000
    shard_bytes = 1_000_000_000
    library = "lhotse"
    owned = OWNED
    record_name = LHOTSE_EXPORT_RECORD

    @staticmethod
    def open_piece(folder: str, context) -> SharPiece:
        return SharPiece(folder, context.columns)

    @staticmethod
    def final_names(number: int, total: int, split, prefix: str) -> dict:
        where = f"{split}/" if split else ""
        return {CUTS_FILE: f"{where}cuts.{number:06d}.jsonl.gz", RECORDING_FILE: f"{where}recording.{number:06d}.tar"}
