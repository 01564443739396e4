"""Which rows an export keeps: export.status, then each quality threshold in turn
(export.min_mos, min_speaker_similarity, max_wer, exclude_flags). A row is counted against the
first filter that removes it, so the counts add up to the rows removed; a row without the
metric's value (its check was off) fails that threshold and is counted apart (`<key>: no value`),
so a threshold on a metric the run never measured is seen at once. Arrow compute over a whole
table, never a loop over rows.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S

if TYPE_CHECKING:  # the config module imports Hydra: not in every export task
    from ..config import ExportSettings

COLUMNS = [S.STATUS, S.MOS, S.SPEAKER_SIMILARITY, S.WER, S.QUALITY_FLAGS]
# (key, column, keeps the row when the value is ...)
THRESHOLDS = (
    ("min_mos", S.MOS, pc.greater_equal),
    ("min_speaker_similarity", S.SPEAKER_SIMILARITY, pc.greater_equal),
    ("max_wer", S.WER, pc.less_equal),
)


def settings_of(export: ExportSettings) -> dict:
    """The filter keys of the export group: what decides the rows (and the export's record,
    JSON: lists as lists)."""
    keys = ["status", "exclude_flags", *[key for key, _, _ in THRESHOLDS]]
    chosen = {key: getattr(export, key) for key in keys}
    return {key: list(value) if isinstance(value, (list, tuple)) else value for key, value in chosen.items()}


def _flagged(flags: pa.ChunkedArray, excluded: list, rows: int) -> np.ndarray:
    """Rows with any of `excluded` among their quality flags."""
    flags = flags.combine_chunks()
    hit = pc.is_in(pc.list_flatten(flags), value_set=pa.array(excluded, pa.string())).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(flags).to_numpy()
    return np.bincount(parents[hit], minlength=rows) > 0


def keep(table: pa.Table, settings: dict, removed: Counter) -> pa.Table:
    """The rows of `table` the filters keep; `removed` counts the others by filter."""
    kept = pc.is_in(table.column(S.STATUS), value_set=pa.array(settings["status"], pa.string()))
    kept = kept.to_numpy(zero_copy_only=False).astype(bool)
    removed["status"] += int((~kept).sum())
    for key, column, passes in THRESHOLDS:
        bound = settings[key]
        if bound is None:
            continue
        values = table.column(column)
        missing = pc.is_null(values).to_numpy(zero_copy_only=False) & kept
        ok = passes(values, bound).fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        removed[key] += int((kept & ~ok & ~missing).sum())
        removed[f"{key}: no value"] += int(missing.sum())
        kept &= ok
    if settings["exclude_flags"]:
        flagged = _flagged(table.column(S.QUALITY_FLAGS), list(settings["exclude_flags"]), table.num_rows) & kept
        removed["exclude_flags"] += int(flagged.sum())
        kept &= ~flagged
    return table.filter(pa.array(kept))
