"""The driver's progress line."""

from __future__ import annotations

from pipeline.run.progress import Progress


def test_progress_line():
    progress = Progress(total=10, already_done=2, interval_s=0, bar="off")
    progress.update(rows=3, errors=1, audio_seconds=1800.0)
    line = progress.line()
    assert line.startswith("5/10 rows (50%)") and "0.500 h audio" in line and "1 errors" in line
    assert "ETA" in line and "slots" not in line  # no engine steps reported yet
    progress.update(rows=1, errors=0, audio_seconds=0.0, slot_rows=30.0, slot_steps=40.0)
    progress.update(rows=1, errors=0, audio_seconds=0.0, slot_rows=10.0, slot_steps=40.0)
    assert "slots 50% full" in progress.line()
    progress.close()
