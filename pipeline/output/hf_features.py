"""The Hugging Face `datasets` features of chorus's output, as the Parquet schema metadata that
`datasets` reads (key `huggingface`: {"info": {"features": ...}}).

With it, `datasets.load_dataset("parquet", data_dir=OUT/data)` types `audio` as an `Audio`
feature at the codec's sample rate (decoded on access) and every other column by its Arrow
type. Written by hand from actors/schema.py's OUTPUT_SCHEMA, so neither the driver nor the
actors need `datasets` installed.
"""

from __future__ import annotations

import json
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S

METADATA_KEY = b"huggingface"
# the Fish codecs' rate: the Audio feature's when no row of a file names one (all error rows)
FALLBACK_SAMPLE_RATE = 44100


def _value_dtype(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_floating(t):
        return f"float{t.bit_width}"  # Arrow says "double" / "float"; datasets' own names
    return str(t)  # int16 / int32 / int64 spell the same in both libraries


def feature(t: pa.DataType) -> dict:
    """The features JSON of one Arrow type (Value, List, or a dict for a struct)."""
    if pa.types.is_struct(t):
        return {t.field(i).name: feature(t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"feature": feature(t.value_type), "_type": "List"}
    return {"dtype": _value_dtype(t), "_type": "Value"}


def features(schema: pa.Schema, sample_rate: int) -> dict:
    """Every column by its Arrow type, except `audio`: an Audio feature at `sample_rate`."""
    out = {f.name: feature(f.type) for f in schema}
    if S.AUDIO in out:
        out[S.AUDIO] = {"sampling_rate": int(sample_rate), "decode": True, "_type": "Audio"}
    return out


def sample_rate_of(table: pa.Table) -> int:
    """The rows' sample rate (one model per output, so one rate); the fallback for none."""
    if S.SAMPLE_RATE not in table.column_names:
        return FALLBACK_SAMPLE_RATE
    rates = pc.drop_null(table.column(S.SAMPLE_RATE))
    return int(rates[0].as_py()) if len(rates) else FALLBACK_SAMPLE_RATE


def metadata(schema: pa.Schema, sample_rate: int) -> dict[bytes, bytes]:
    """The schema metadata entry that `datasets` reads its features from."""
    return {METADATA_KEY: json.dumps({"info": {"features": features(schema, sample_rate)}}).encode("utf-8")}


def with_features(table: pa.Table, sample_rate: Optional[int] = None) -> pa.Table:
    """`table` whose schema carries the features metadata (other metadata kept)."""
    rate = sample_rate if sample_rate is not None else sample_rate_of(table)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata(table.schema, rate)})
