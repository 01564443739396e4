"""Hugging Face Hub layout: `data/<split>-00000-of-00004.parquet`, ... (push_to_hub's names; the
split `train`, or each of export.splits) with export.columns as stored, `audio` an `Audio`
feature with the FLAC bytes embedded (its `path` the sample's key + .flac) and the features in
each file's schema metadata, plus README.md, a dataset card whose YAML names the features
(`dataset_info`), the files of each split (`configs`), the `license` and `language`
(export.license, export.language), and whose text gives the run's model, settings and counts.
`datasets.load_dataset(DEST)` finds every split with no other argument, and the directory can be
pushed to the Hub as it is. The card's YAML is written by hand from the same features, so
exporting needs no `datasets`.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from actors import schema as S

from ..names import EXPORT_RECORD
from ..output import hf_features
from ..output.reading import conform
from .formats import Format
from .splits import DEFAULT_SPLIT

SHARD_FILE = "shard.parquet"
CARD_FILE = "README.md"
# rows per row group: small, as the Hub's viewer reads audio a row group at a time
ROW_GROUP_ROWS = 100
OWNED = re.compile(rf"data/[A-Za-z0-9][A-Za-z0-9_]*-\d{{5}}-of-\d{{5}}\.parquet|{CARD_FILE}")


def data_files(split: str) -> str:
    return f"data/{split}-*"


def export_schema(columns: list) -> pa.Schema:
    """The exported columns' types, as OUTPUT_SCHEMA has them."""
    return pa.schema([S.OUTPUT_SCHEMA.field(c) for c in columns])


class ParquetPiece:
    def __init__(self, folder: str, columns: list):
        self.path = f"{folder}/{SHARD_FILE}"
        self.columns = columns
        self.writer = None

    def add(self, table: pa.Table) -> None:
        table = conform(table)
        rate = hf_features.sample_rate_of(table)
        table = table.select(self.columns)
        keys = pa.array([f"{S.sample_key(i)}.flac" for i in table.column(S.ID).to_pylist()], pa.string())
        audio = table.column(S.AUDIO).combine_chunks()
        with_path = pa.StructArray.from_arrays([audio.field(S.AUDIO_BYTES), keys], fields=list(S.AUDIO_TYPE))
        table = table.set_column(table.schema.get_field_index(S.AUDIO), S.AUDIO, with_path)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, hf_features.with_features(table, rate).schema)
        self.writer.write_table(table.replace_schema_metadata(self.writer.schema.metadata), ROW_GROUP_ROWS)

    def close(self) -> None:
        self.writer.close()


def yaml_feature(feature: dict):
    """One feature of hf_features' JSON in the card's YAML form (datasets' `_to_yaml_list`)."""
    kind = feature.get("_type")
    if kind == "Value":
        return {"dtype": feature["dtype"]}
    if kind == "Audio":
        return {"dtype": {"audio": {"sampling_rate": feature["sampling_rate"]}}}
    if kind == "List":
        inner = yaml_feature(feature["feature"])
        return {"list": inner.get("dtype", inner.get("struct", inner))}
    return {"struct": [{"name": name, **yaml_feature(sub)} for name, sub in feature.items()]}


def yaml_features(features: dict) -> list:
    return [{"name": name, **yaml_feature(feature)} for name, feature in features.items()]


def card_header(summary: dict, features: dict) -> dict:
    """The card's YAML: licence and languages (when given), features, splits, their files."""
    splits = summary["splits"]
    chosen = summary["card"]
    header = {k: v for k, v in (("license", chosen["license"]), ("language", chosen["language"])) if v}
    header["dataset_info"] = {
        "features": yaml_features(features),
        "splits": [
            {"name": name, "num_bytes": counts["audio_bytes"], "num_examples": counts["rows"]}
            for name, counts in splits.items()
        ],
        "dataset_size": summary["audio_bytes"],
    }
    files = [{"split": name, "path": data_files(name)} for name in splits]
    header["configs"] = [{"config_name": "default", "data_files": files}]
    header["task_categories"] = ["text-to-speech"]
    header["tags"] = ["audio", "synthetic", "chorus"]
    return header


def card(summary: dict, features: dict) -> str:
    """The dataset card: YAML (licence, languages, features, splits, files) and a text naming the run."""
    header = card_header(summary, features)
    source = summary.get("source", {})
    lines = [
        "---",
        yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        "# Synthesized speech",
        "",
        f"Made with chorus from `{summary['source_dir']}`: {summary['rows']:,} rows, "
        f"{summary['audio_seconds'] / 3600:.2f} hours of audio, in {summary['shards']} file(s) under `data/`.",
        "",
        f"- model: `{source.get('model')}` (checkpoint `{source.get('checkpoint')}`)",
        f"- sampling: `{json.dumps(source.get('sampling'), sort_keys=True)}`",
        f"- quality gate: `{json.dumps(source.get('quality'), sort_keys=True)}`",
        f"- export filters: `{json.dumps(summary['filters'], sort_keys=True)}`",
        f"- rows removed by each filter: `{json.dumps(summary['removed'], sort_keys=True)}`",
        "",
        f'`datasets.load_dataset("<this directory>")` reads the split(s) {", ".join(map(repr, summary["splits"]))}; '
        f"`audio` holds FLAC bytes ({summary.get('sample_rate')} Hz; `Audio(decode=False)` gives them as they are). "
        "Splits are fixed by a hash of each row's id (BLAKE2b, 8 bytes): a row keeps its split as the dataset grows.",
        "",
    ]
    return "\n".join(lines)


class HubParquetFormat(Format):
    name = "hf"
    default_dir = "hf"
    # push_to_hub's max_shard_size default ("500MB"); rows: no bound of its own
    shard_rows = 1_000_000
    shard_bytes = 500_000_000
    library = None
    owned = OWNED
    record_name = EXPORT_RECORD

    @staticmethod
    def open_piece(folder: str, context) -> ParquetPiece:
        return ParquetPiece(folder, context.columns)

    @staticmethod
    def final_names(number: int, total: int, split, prefix: str) -> dict:
        return {SHARD_FILE: f"data/{split or DEFAULT_SPLIT}-{number:05d}-of-{total:05d}.parquet"}

    @staticmethod
    def finish(destination, pieces: list, summary: dict) -> None:
        rate = summary.get("sample_rate") or hf_features.FALLBACK_SAMPLE_RATE
        features = hf_features.features(export_schema(summary["columns"]), rate)
        destination.write_text(CARD_FILE, card(summary, features))
