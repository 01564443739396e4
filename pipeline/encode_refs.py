"""`chorus encode-refs OUT.parquet data=parquet data.path=IN [any run setting: model.*, data.*]`
(`python -m pipeline.encode_refs`).

Writes a copy of the input table with a `ref_codes` column (data.columns.ref_codes names it):
each row's reference (ref_audio or ref_audio_path) encoded by the run's codec, as a run would
encode it -- same clip checks, same root confinement, each distinct clip (or ref_id) encoded
once; a dialogue row's `voices` get each voice's `codes` the same way. A run given that table reads no clip and encodes nothing: a row's `ref_codes` is used in
place of its audio. Rows without a reference get null; a row whose clip cannot be used gets
null too and is listed (the run then reports the same error for it). Rows that already have
ref_codes keep them. The model and codec load here, in this process (the actor's own code
does the work), so run it where the model's weights are.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from dataclasses import asdict
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from actors import schema as S

from .config import ChorusConfig
from .location import is_local, local_path
from .plan.inputs import scan_input
from .run.actor_settings import actor_arguments

log = logging.getLogger("chorus.encode_refs")
ROWS_PER_CALL = 64  # rows per actor call: distinct clips of a call are encoded in codec batches
REF_CODES_TYPE = pa.list_(pa.list_(pa.int16()))


def encode_refs(out_path: str, config: ChorusConfig) -> dict:
    """Write the input of `config` with its ref_codes column to `out_path` (atomically);
    returns counts."""
    from actors.synth import SynthActor

    columns = config.data.columns
    scan = scan_input(config.data.path, asdict(columns))
    actor = SynthActor(**actor_arguments(config, scan.root, run_id="encode-refs"))
    codes_name, voices_name = columns.ref_codes, columns.voices
    tables, failures, counts = [], [], {"encoded": 0}
    for path in scan.files:
        table = pq.read_table(path, filesystem=scan.filesystem)
        canonical = table.rename_columns([scan.rename.get(n, n) for n in table.column_names])
        ref_codes, voices = [], []
        for start in range(0, table.num_rows, ROWS_PER_CALL):
            part = canonical.slice(start, ROWS_PER_CALL)
            for row, encoded in zip(part.to_pylist(), actor.encode_references(_without_codes(part))):
                ref_codes.append(_ref_codes(row, encoded, counts))
                voices.append(_voices(row, encoded, counts))
                if encoded.error is not None:
                    failures.append(f"row {row.get(S.ID)!r}: {encoded.error}")
        column = pa.array(ref_codes, type=REF_CODES_TYPE)
        table = _with_column(table, codes_name, column)
        voices_type = _voices_type(canonical.schema)
        if voices_type is not None:
            table = _with_column(table, voices_name, pa.array(voices, type=voices_type))
        tables.append(table)
    result = pa.concat_tables(tables, promote_options="default")
    if is_local(out_path):
        out_path = local_path(out_path)
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        temp = f"{out_path}.{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(result, temp)
        os.replace(temp, out_path)  # never a half-written table under the name
    else:
        pq.write_table(result, out_path)
    for failure in failures:
        log.warning("no ref_codes for %s", failure)
    return {"rows": result.num_rows, "encoded": counts["encoded"], "failed": len(failures), "output": out_path}


def _without_codes(part: pa.Table) -> pa.Table:
    """The rows as the actor is to encode them: codes a row already has are kept as they are
    (a ref_codes cell; a voice's codes), so only the clips without codes are encoded."""
    if S.REF_CODES in part.column_names:
        part = part.drop_columns([S.REF_CODES])
    return part


def _ref_codes(row: dict, encoded, counts: dict):
    """A plain row's ref_codes cell: the codes it had, else its clip's, else null."""
    if row.get(S.REF_CODES) is not None:
        return row[S.REF_CODES]
    if encoded.codes is None:
        return None
    counts["encoded"] += 1
    return encoded.codes.tolist()


def _voices(row: dict, encoded, counts: dict):
    """A dialogue row's voices with each voice's codes filled in (those it had are kept)."""
    voices = row.get(S.VOICES)
    if not voices or encoded.voices is None:
        return voices
    out = []
    for voice, codes in zip(voices, encoded.voices):
        if voice.get(S.VOICE_CODES) is None:
            voice = {**voice, S.VOICE_CODES: codes.tolist()}
            counts["encoded"] += 1
        out.append(voice)
    return out


def _voices_type(schema: pa.Schema) -> Optional[pa.DataType]:
    """The voices column's type with a codes field (list<list<int16>>); None when the table has
    no voices (or only nulls there)."""
    index = schema.get_field_index(S.VOICES)
    struct = getattr(schema.field(index).type, "value_type", None) if index >= 0 else None
    if struct is None or not pa.types.is_struct(struct):
        return None
    fields = [f for f in struct if f.name != S.VOICE_CODES] + [pa.field(S.VOICE_CODES, REF_CODES_TYPE)]
    return pa.list_(pa.struct(fields))


def _with_column(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, column)
    return table.append_column(name, column)


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["encode-refs", *sys.argv[1:]], filter_stderr=True))
