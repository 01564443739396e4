"""`python -m pipeline.encode_refs OUT.parquet data.path=IN [any run setting: model.*, data.*]`

Writes a copy of the input table with a `ref_codes` column (data.columns.ref_codes names it):
each row's reference (ref_audio or ref_audio_path) encoded by the run's codec, as a run would
encode it -- same clip checks, same root confinement, each distinct clip (or ref_id) encoded
once. A run given that table reads no clip and encodes nothing: a row's `ref_codes` is used in
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

import pyarrow as pa
import pyarrow.parquet as pq

from actors import schema as S

from .config import compose, to_plain
from .location import is_local, local_path
from .plan.inputs import scan_input
from .run.actor_settings import actor_arguments

log = logging.getLogger("chorus.encode_refs")
ROWS_PER_CALL = 64  # rows per actor call: distinct clips of a call are encoded in codec batches
REF_CODES_TYPE = pa.list_(pa.list_(pa.int16()))


def encode_refs(out_path: str, overrides: list[str]) -> dict:
    """Write the input with its ref_codes column to `out_path` (atomically); returns counts."""
    from actors.synth import SynthActor

    cfg = compose(overrides)
    plain = to_plain(cfg)
    columns = plain["data"]["columns"]
    scan = scan_input(plain["data"]["path"], columns)
    actor = SynthActor(**actor_arguments(cfg, scan.root, run_id="encode-refs"))
    codes_name = columns.get(S.REF_CODES, S.REF_CODES)
    tables, failures, encoded = [], [], 0
    for path in scan.files:
        table = pq.read_table(path, filesystem=scan.filesystem)
        canonical = table.rename_columns([scan.rename.get(n, n) for n in table.column_names])
        existing = canonical.column(S.REF_CODES).to_pylist() if S.REF_CODES in canonical.column_names else None
        values = []
        for start in range(0, table.num_rows, ROWS_PER_CALL):
            part = canonical.slice(start, ROWS_PER_CALL)
            if existing is not None:  # encode only the rows that do not have codes yet
                part = part.drop_columns([S.REF_CODES])
            for offset, (codes, error) in enumerate(actor.encode_references(part)):
                row = start + offset
                if existing is not None and existing[row] is not None:
                    values.append(existing[row])
                elif codes is not None:
                    values.append(codes.tolist())
                    encoded += 1
                else:
                    values.append(None)
                    if error is not None:
                        failures.append(f"row {canonical.column(S.ID)[row].as_py()!r}: {error}")
        column = pa.array(values, type=REF_CODES_TYPE)
        if codes_name in table.column_names:
            table = table.set_column(table.column_names.index(codes_name), codes_name, column)
        else:
            table = table.append_column(codes_name, column)
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
    return {"rows": result.num_rows, "encoded": encoded, "failed": len(failures), "output": out_path}


def main(argv: list[str]) -> int:
    if not argv or "=" in argv[0]:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    counts = encode_refs(argv[0], argv[1:])
    log.info(
        "%d rows, %d references encoded, %d without codes (listed above); written to %s",
        counts["rows"],
        counts["encoded"],
        counts["failed"],
        counts["output"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
