"""The job's read: only the rows planning chose, each with its content hash, in small blocks.

One read task per fragment holding rows to synthesize (pipeline/planning.py TodoFragment):
it reads the fragment's row group, keeps its chosen rows and appends their content hashes.
Nothing a task does depends on the job's other rows.

The blocks are cut by the read itself (override_num_blocks: Ray Data splits each task's
output), not by repartition(target_num_rows_per_block=...): in Ray 2.60 that operator's tasks
ask for a whole CPU, which a node whose actors hold part of its CPU never has free, and the
run hangs. For the same reason the read holds a quarter CPU. A Datasource of our own also
skips read_parquet's remote sampling task (~0.8 s per run).
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from actors import schema as S

from .inputs import ROW, InputScan, read_fragment
from .planning import TodoFragment, todo_rows


def read_chosen_rows(scan: InputScan, todo: TodoFragment) -> pa.Table:
    """One fragment's rows to synthesize (canonical columns + content_hash), in file order."""
    fragment = scan.fragments[todo.fragment]
    chosen = todo_rows(todo).sort_by(ROW)
    table = read_fragment(scan, fragment)
    table = table.take(pc.subtract(chosen.column(ROW), fragment.first_row))
    return table.append_column(S.CONTENT_HASH, chosen.column(S.CONTENT_HASH))


def _datasource(scan: InputScan, todo: list[TodoFragment]):
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ChosenRows(Datasource):
        def get_name(self) -> str:
            return "ChosenRows"

        def estimate_inmemory_data_size(self) -> Optional[int]:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            return [
                ReadTask(
                    lambda entry=entry: [read_chosen_rows(scan, entry)],
                    BlockMetadata(num_rows=entry.rows, size_bytes=None, input_files=None, exec_stats=None),
                )
                for entry in todo
            ]

    return ChosenRows()


def read_dataset(scan: InputScan, todo: list[TodoFragment], rows_per_block: int):
    """Ray Data dataset of the rows to synthesize, in blocks of about `rows_per_block` rows,
    so that a small table of text is spread over every actor instead of arriving as one block
    for one actor."""
    import ray

    rows = sum(entry.rows for entry in todo)
    blocks = max(1, -(-rows // rows_per_block))
    return ray.data.read_datasource(_datasource(scan, todo), num_cpus=0.25, override_num_blocks=blocks)
