"""Export: one safe audio file per ok row, and files.csv naming each row's file or error."""

from __future__ import annotations

import csv

import pytest
import soundfile as sf

from actors import schema as S
from pipeline.names import REJECTED_PART
from pipeline.output.audio_files import export
from pipeline.output.layout import OutputLayout
from pipeline.output.parts import write_block
from tests.helpers import ok_row


def test_export_writes_one_safe_file_per_ok_row(tmp_path):
    layout = OutputLayout(str(tmp_path / "out"))
    layout.ensure()
    ids = ["plain", "Plain", "has space", "ünï"]
    write_block(S.output_table([ok_row(i) for i in ids[:2]]), layout.location)
    write_block(S.output_table([ok_row(i) for i in ids[2:]] + [S.error_row("broken", "bad text")]), layout.location)
    layout.write_part(
        S.output_table(
            [S.error_row(None, "id is null"), S.error_row("dup", "duplicate"), S.error_row("dup", "duplicate")]
        ),
        REJECTED_PART,
    )
    report = export(layout.location)
    assert (report.written, report.errors) == (4, 4)
    audio_dir = tmp_path / "out" / "audio"
    with open(audio_dir / "files.csv", newline="") as f:
        index = {row["id"]: row for row in csv.DictReader(f)}
    names = [index[i]["file"] for i in ids]
    assert names[0] == "plain.flac" and len({n.lower() for n in names}) == 4  # case-insensitive safe
    for row_id in ids:
        wave, rate = sf.read(audio_dir / index[row_id]["file"])
        assert len(wave) / rate == pytest.approx(0.25)
    assert index["broken"]["file"] == "" and "bad text" in index["broken"]["error"]
    assert export(layout.location).skipped == 4  # a second export leaves existing files alone
