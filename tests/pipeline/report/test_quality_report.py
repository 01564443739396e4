"""summary.json's quality figures and the report's quality section, from output rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from actors import schema as S
from pipeline.report import quality_figures as quality


def rows() -> pa.Table:
    def row(i, status, flags, attempts, frames, discarded, lufs):
        return {
            S.ID: f"r{i}",
            S.STATUS: status,
            S.TEXT: f"text {i}",
            S.N_FRAMES: frames,
            S.ATTEMPTS: attempts,
            S.QUALITY_FLAGS: flags,
            S.DISCARDED_FRAMES: discarded,
            S.LOUDNESS_LUFS: lufs,
            S.SILENCE_RATIO: 0.1 * i,
        }

    return S.output_table(
        [
            row(0, "ok", [], 1, 100, 0, -20.0),
            row(1, "ok", [], 2, 100, 0, -22.0),
            row(2, "ok", ["silence", "loudness"], 1, 50, 0, None),
            row(3, "rejected", ["no_audio"], 3, 0, 0, None),
            row(4, "rejected", ["truncated", "silence"], 3, 200, 400, -30.0),
            {S.ID: "r5", S.STATUS: "error", S.ERROR: "text is empty"},
        ]
    )


def test_the_figures_count_statuses_flags_attempts_and_regeneration():
    fig = quality.figures(rows())
    assert fig["rows_by_status"] == {"error": 1, "ok": 3, "rejected": 2}
    assert fig["rows_by_flag"] == {"no_audio": 1, "truncated": 1, "silence": 2, "loudness": 1}
    assert fig["rows_by_attempts"] == {"1": 2, "2": 1, "3": 2}
    assert fig["discarded_frames"] == 400 and fig["discarded_share"] == pytest.approx(400 / (450 + 400))
    assert fig["metrics"][S.LOUDNESS_LUFS]["p50"] == pytest.approx(-22.0)
    assert S.WER not in fig["metrics"]  # no ASR ran


def test_the_worst_rows_come_rejected_first_then_by_severity():
    assert quality.worst_rows(rows(), 10) == [3, 4, 2]
    assert quality.worst_rows(rows(), 1) == [3]


def test_the_section_lists_the_worst_rows_with_players():
    page = quality.section(rows(), player=lambda i: f"<audio data-row={i}></audio>")
    assert "<h2>Quality</h2>" in page and "rejected: 2" in page and "47.06% of frames generated" in page
    assert page.index("data-row=3") < page.index("data-row=4") < page.index("data-row=2")
    assert "data-row=0" not in page  # no flags: not among the worst


def test_an_output_without_quality_columns():
    old = pa.table({S.ID: ["a"], S.STATUS: ["ok"], S.N_FRAMES: [10]})
    assert quality.figures(old)["rows_by_attempts"] == {} and quality.worst_rows(old, 5) == []
    assert "No quality columns" in quality.section(old, player=str)


def test_the_report_page_has_the_section_with_the_worst_rows_audio(tmp_path):
    import base64
    import io
    import re

    import soundfile as sf

    from pipeline.report.page import write_report
    from tests.helpers import make_rows, write_run

    run = make_rows(n=6, n_err=1)
    for i, row in enumerate(run[:-1]):
        row.update({S.ATTEMPTS: 1, S.QUALITY_FLAGS: [], S.DISCARDED_FRAMES: 0, S.LOUDNESS_LUFS: -20.0 - i})
    run[2].update(status=S.STATUS_REJECTED, **{S.ATTEMPTS: 3, S.QUALITY_FLAGS: ["silence"], S.DISCARDED_FRAMES: 30})
    doc = open(write_report(str(write_run(tmp_path / "out", run)))).read()
    section = doc[doc.index("<h2>Quality</h2>") :]
    assert "rejected: 1" in section and "attempts" in section and "silence: 1" in section
    worst = section[section.index("Worst rows") :]
    assert run[2]["id"] in worst and run[1]["id"] not in worst
    src = re.search(r'<audio controls preload="metadata" src="data:[^;]+;base64,([^"]+)"', worst).group(1)
    audio, sr = sf.read(io.BytesIO(base64.b64decode(src)))
    assert len(audio) / sr == pytest.approx(run[2]["audio_seconds"], abs=1e-3)


def test_rejected_rows_are_neither_ok_nor_errors_in_the_counts():
    from pipeline.output.parts import block_stats
    from pipeline.report import metrics

    table = metrics.normalise(rows())
    assert metrics.counts(table) == {"rows": 6, "rows_ok": 3, "rows_error": 1, "rows_rejected": 2}
    assert [k["error"] for k in metrics.error_kinds(table)] == ["text is empty"]
    stats = block_stats(rows(), "part")
    assert (stats["ok"], stats["errors"]) == (3, 1)


def test_the_worst_rows_play_beside_their_reference_clip_with_the_model_scores(tmp_path):
    """A row flagged `speaker` shows its similarity and MOS and, beside its own audio, the
    reference clip its `reference` column names, embedded so the page plays it from anywhere;
    a clip that cannot be read is noted on the page, not fatal."""
    import base64
    import re

    from pipeline.report.page import write_report
    from tests.helpers import REPO, make_rows, write_run

    clip = REPO / "data" / "demo" / "refs" / "ada.flac"
    run = make_rows(n=6, n_err=1)
    for i, row in enumerate(run[:-1]):
        row.update({S.ATTEMPTS: 1, S.QUALITY_FLAGS: [], S.DISCARDED_FRAMES: 0, S.MOS: 3.5 + 0.1 * i})
        row.update({S.SPEAKER_SIMILARITY: 0.9, S.REFERENCE: None})
    run[2].update(status=S.STATUS_REJECTED, **{S.QUALITY_FLAGS: ["speaker"], S.SPEAKER_SIMILARITY: 0.41})
    run[2][S.REFERENCE] = str(clip)
    run[3].update(**{S.QUALITY_FLAGS: ["mos"], S.MOS: 2.2, S.REFERENCE: str(tmp_path / "gone.flac")})
    doc = open(write_report(str(write_run(tmp_path / "out", run)))).read()
    section = doc[doc.index("<h2>Quality</h2>") :]
    assert re.search(r"<th>speaker_similarity</th>.*<th>mos</th>", section)  # the distributions
    worst = section[section.index("Worst rows") :]
    assert "<th>reference</th>" in worst and '<td class="num">0.41</td>' in worst
    row = worst[worst.index(run[2]["id"]) :].split("</tr>")[0]
    players = re.findall(r'<audio controls preload="metadata" src="data:[^;]+;base64,([^"]+)"', row)
    assert len(players) == 2 and base64.b64decode(players[1]) == clip.read_bytes()
    assert "gone.flac could not be read" in doc  # the page's notes
