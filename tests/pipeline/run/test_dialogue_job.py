"""Dialogue rows end to end on the session's local Ray, on the tiny S2 demo (model=demo_s2): the
demo's dialogue rows beside plain ones, output.channels=per_speaker. Every dialogue row's turns
name its tagged speakers in order and tile its audio; channel i is exactly zero outside speaker
i's turns; a mono run of the same rows (other actors, other blocks) gives the same codes and
audio equal to the channels' sum; a rerun redoes nothing; in bfloat16 too, the same row gives
the same audio in any block and actor."""

from __future__ import annotations

import io
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from actors import schema as S
from pipeline.config import compose_typed
from pipeline.run.steps import run
from tests.helpers import DEMO_TABLE, DIALOGUE_TABLE

pytestmark = pytest.mark.slow

SPEAKER_TAG = re.compile(r"<\|speaker:(\d+)\|>")
VOICES = {row[S.ID]: len(row[S.VOICES]) for row in pq.read_table(DIALOGUE_TABLE, columns=[S.ID, S.VOICES]).to_pylist()}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    """Six plain demo rows (with and without clips) and the demo's three dialogue rows."""
    dialogues = pq.read_table(DIALOGUE_TABLE)
    assert dialogues.num_rows == len(VOICES) == 3
    table = pa.concat_tables([pq.read_table(DEMO_TABLE).slice(0, 6), dialogues], promote_options="default")
    path = tmp_path_factory.mktemp("dialogue-in") / "in.parquet"
    pq.write_table(table, path)
    return str(path)


def synthesize(small_settings, source, out, *overrides):
    return run(
        compose_typed(
            [
                *small_settings,
                "model=demo_s2",
                f"data.path={source}",
                f"data.audio_root={DEMO_TABLE.parent}",
                f"output.dir={out}",
                *overrides,
            ]
        )
    )


def audio(row: dict) -> np.ndarray:
    return sf.read(io.BytesIO(row[S.AUDIO][S.AUDIO_BYTES]), dtype="float32")[0]


def by_id(read_rows, out) -> dict:
    rows = read_rows(out)
    assert len(rows) == 9 and all(r[S.STATUS] == S.STATUS_OK for r in rows), [r[S.ERROR] for r in rows]
    return {r[S.ID]: r for r in rows}


def assert_turns_tile_the_channels(row: dict) -> None:
    turns, channels = row[S.TURNS], audio(row)
    assert [t[S.TURN_SPEAKER] for t in turns] == [int(i) for i in SPEAKER_TAG.findall(row[S.TEXT])]
    assert turns[0][S.TURN_START_S] == 0.0 and turns[-1][S.TURN_END_S] == row[S.AUDIO_SECONDS]
    assert all(a[S.TURN_END_S] == b[S.TURN_START_S] for a, b in zip(turns, turns[1:]))  # no gap, no overlap
    rate = row[S.SAMPLE_RATE]
    assert channels.shape == (round(row[S.AUDIO_SECONDS] * rate), VOICES[row[S.ID]])  # a channel per voice
    for voice in range(channels.shape[1]):
        inside = np.zeros(len(channels), dtype=bool)
        for t in turns:
            if t[S.TURN_SPEAKER] == voice:
                inside[round(t[S.TURN_START_S] * rate) : round(t[S.TURN_END_S] * rate)] = True
        assert not channels[~inside, voice].any(), (row[S.ID], voice)  # exact zeros, no slack needed


@pytest.fixture(scope="module")
def float32_runs(ray_cluster, source, small_settings, read_rows, tmp_path_factory):
    root = tmp_path_factory.mktemp("dialogue-f32")
    f32 = ["model.dtype=float32", "model.codec_dtype=float32"]
    split = [*f32, "output.channels=per_speaker", "cluster.num_actors=2", "cluster.rows_per_block=3"]
    first = synthesize(small_settings, source, root / "split", *split)
    again = synthesize(small_settings, source, root / "split", *split)
    synthesize(small_settings, source, root / "mono", *f32, "cluster.num_actors=1", "cluster.rows_per_block=4")
    return first, again, by_id(read_rows, root / "split"), by_id(read_rows, root / "mono")


def test_per_speaker_channels_hold_each_voices_turns(float32_runs):
    _, _, split, _ = float32_runs
    dialogue = [r for r in split.values() if len(r[S.TURNS]) > 1]
    assert len(dialogue) == 3
    for row in dialogue:
        assert_turns_tile_the_channels(row)
    for row in split.values():
        if len(row[S.TURNS]) == 1:
            assert audio(row).ndim == 1  # plain rows stay mono


def test_the_mono_run_is_the_channels_sum_and_a_rerun_redoes_nothing(float32_runs):
    first, again, split, mono = float32_runs
    assert first.summary["run_rows"] == 9 and again.summary["run_rows"] == 0
    for row_id, row in split.items():
        other = mono[row_id]
        assert other[S.CODES] == row[S.CODES] and other[S.TURNS] == row[S.TURNS], row_id
        channels = audio(row)
        summed = channels.sum(axis=1) if channels.ndim == 2 else channels
        np.testing.assert_array_equal(audio(other), summed, err_msg=row_id)


def test_bfloat16_dialogue_rows_are_the_same_in_any_block_and_actor(
    ray_cluster, source, small_settings, read_rows, tmp_path
):
    bf16 = ["model.dtype=bfloat16", "model.codec_dtype=bfloat16", "output.channels=per_speaker"]
    for actors, block in ((2, 3), (1, 4)):
        synthesize(
            small_settings,
            source,
            tmp_path / f"a{actors}",
            *bf16,
            f"cluster.num_actors={actors}",
            f"cluster.rows_per_block={block}",
        )
    two, one = by_id(read_rows, tmp_path / "a2"), by_id(read_rows, tmp_path / "a1")
    assert len({r[S.ACTOR] for r in two.values()}) == 2
    for row_id, row in two.items():
        assert one[row_id][S.CODES] == row[S.CODES], row_id
        assert one[row_id][S.AUDIO][S.AUDIO_BYTES] == row[S.AUDIO][S.AUDIO_BYTES], row_id
        if len(row[S.TURNS]) > 1:
            assert_turns_tile_the_channels(row)
