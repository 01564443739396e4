"""Dialogue rows on the driver's side, without a model: the content hash covers every voice (and
output.channels, for dialogue rows only), preview counts dialogue rows, voices and turns, export
writes multichannel files and files.csv's turns, the output files type `turns` for `datasets`, and
the report shows a dialogue's turns under its player, the figures and plots on its first screen."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

from actors import schema as S
from helpers import export_in_process, export_settings, export_source, make_rows, ok_row, two_voice_flac, write_run
from pipeline.config import compose_typed
from pipeline.export.job import export
from pipeline.output import hf_features
from pipeline.plan.keys import RowHasher
from pipeline.preview import preview
from pipeline.report.page import write_report

VOICE = pa.struct([(S.VOICE_AUDIO, pa.binary()), (S.VOICE_AUDIO_PATH, pa.string()), (S.VOICE_TEXT, pa.string())])
SCHEMA = pa.schema([(S.ID, pa.string()), (S.TEXT, pa.string()), (S.VOICES, pa.list_(VOICE))])
TALK = "<|speaker:0|>Hello.<|speaker:1|>Hi there.<|speaker:0|>Bye."


def voice(path=None, text="Words.", audio=None) -> dict:
    return {S.VOICE_AUDIO: audio, S.VOICE_AUDIO_PATH: path, S.VOICE_TEXT: text}


def table(*rows: dict) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SCHEMA)


def test_the_content_hash_covers_every_voice_and_channels_for_dialogue_rows_only(tmp_path):
    (tmp_path / "a.flac").write_bytes(b"first clip")

    def hashes(voices, channels=S.CHANNELS_MONO) -> list:
        rows = table({S.ID: "talk", S.TEXT: TALK, S.VOICES: voices}, {S.ID: "plain", S.TEXT: "Words."})
        return RowHasher("settings", None, str(tmp_path), channels).hashes(rows)

    base = hashes([voice("a.flac"), voice(audio=b"second clip")])
    assert base == hashes([voice("a.flac"), voice(audio=b"second clip")])  # stable
    changed = [
        hashes([voice("a.flac", text="Other words."), voice(audio=b"second clip")]),  # a transcript
        hashes([voice("a.flac"), voice(audio=b"another clip")]),  # a clip's bytes
        hashes([voice("a.flac")]),  # a voice fewer
        hashes([voice("a.flac"), voice(audio=b"second clip")], S.CHANNELS_PER_SPEAKER),  # channels
    ]
    (tmp_path / "a.flac").write_bytes(b"first clip, re-recorded")  # the file under the same name
    os.utime(tmp_path / "a.flac", ns=(1, 1))
    changed.append(hashes([voice("a.flac"), voice(audio=b"second clip")]))
    for other in changed:
        assert other[0] != base[0] and other[1] == base[1]  # the dialogue row's hash alone moves


def test_preview_counts_dialogue_rows_voices_and_turns(tmp_path, capsys):
    rows = table(
        {S.ID: "two", S.TEXT: TALK, S.VOICES: [voice("a.flac"), voice("b.flac")]},
        {S.ID: "three", S.TEXT: TALK + "<|speaker:2|>Me too.", S.VOICES: [voice("a.flac")] * 3},
        {S.ID: "one", S.TEXT: "No tag at all.", S.VOICES: [voice("a.flac")]},  # one voice: one turn
        {S.ID: "plain", S.TEXT: "Words."},
        {S.ID: "empty", S.TEXT: "Words.", S.VOICES: []},  # [] is a plain row
    )
    pq.write_table(rows, tmp_path / "in.parquet")
    figures = preview(compose_typed([f"data.path={tmp_path / 'in.parquet'}", f"output.dir={tmp_path}/out"]))
    assert (figures["dialogue_rows"], figures["voices"], figures["turns"]) == (3, 6, 8)
    assert "| dialogue rows (voices, turns) | 3 (6, 8) |" in capsys.readouterr().out


def test_export_writes_multichannel_files_and_the_turns(tmp_path):
    wave, flac = two_voice_flac(1.0)
    turns = [
        {S.TURN_SPEAKER: 0, S.TURN_TEXT: "Hello.", S.TURN_START_S: 0.0, S.TURN_END_S: 0.5},
        {S.TURN_SPEAKER: 1, S.TURN_TEXT: "Hi, “there”.", S.TURN_START_S: 0.5, S.TURN_END_S: 1.0},
    ]
    talk = {**ok_row("talk", 1.0), S.AUDIO: {S.AUDIO_BYTES: flac, S.AUDIO_PATH: None}, S.TURNS: turns}
    layout = export_source(tmp_path / "out", [talk, ok_row("plain")])
    # the turns on request (export.columns): who speaks when, beside each file
    columns = [S.ID, S.TEXT, S.AUDIO, S.AUDIO_SECONDS, S.TURNS]
    report = export(layout.location, export_settings(columns=columns), export_in_process())
    assert report.summary["rows"] == 2
    audio_dir = tmp_path / "out" / "audio"
    channels, _ = sf.read(audio_dir / "talk.flac")
    assert channels.shape == (44100, 2)
    np.testing.assert_array_equal(channels, wave)  # the file as the row holds it
    with open(audio_dir / "files.csv", newline="", encoding="utf-8") as f:
        index = {row["id"]: row for row in csv.DictReader(f)}
    listed = json.loads(index["talk"][S.TURNS])
    assert [(t[S.TURN_SPEAKER], t[S.TURN_TEXT], t[S.TURN_END_S]) for t in listed] == [
        (0, "Hello.", 0.5),
        (1, "Hi, “there”.", 1.0),
    ]
    assert index["plain"][S.TURNS] == ""  # no turns written for this row
    (part,) = layout.parts()
    features = json.loads(pq.read_schema(part).metadata[hf_features.METADATA_KEY])["info"]["features"]
    assert features[S.TURNS]["_type"] == "List"
    assert features[S.TURNS]["feature"][S.TURN_START_S] == features[S.AUDIO_SECONDS]  # a float, as every other


def test_the_report_shows_a_dialogues_turns_and_puts_its_figures_first(tmp_path):
    rows = [{**row, S.TURNS: None} for row in make_rows(8, n_err=1)]
    rows[3][S.TURNS] = [
        {S.TURN_SPEAKER: 0, S.TURN_TEXT: "Hello.", S.TURN_START_S: 0.0, S.TURN_END_S: 0.5},
        {S.TURN_SPEAKER: 1, S.TURN_TEXT: "Hi.", S.TURN_START_S: 0.5, S.TURN_END_S: 1.25},
    ]
    out = write_run(tmp_path / "run", rows, summary={"rows_ok": 7, "rows_error": 1, "wall_s": 5.0})
    page = open(write_report(str(out), max_audio_rows=8), encoding="utf-8").read()
    assert "speaker: 0: 0.00–0.50 s · 1: 0.50–1.25 s" in page  # under the dialogue row's player
    assert page.count('<div class="turns">') == 1  # plain rows (one turn or none) show nothing
    summary, plots, folded = (
        page.index("<h2>Summary</h2>"),
        page.index("<h2>Plots</h2>"),
        page.index('<details class="summary-file">'),
    )
    assert summary < plots < folded  # the figures and the plots first, the raw summary.json below them
    assert '<details class="summary-file"><summary><h2>summary.json</h2></summary>' in page
