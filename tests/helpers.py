"""Shared test helpers (plain functions; fixtures live in the test modules/conftest)."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_TABLE = REPO / "data" / "demo" / "demo.parquet"
DIALOGUE_TABLE = DEMO_TABLE.with_name("dialogue.parquet")  # the demo's dialogue rows (model=demo_s2)
VECTORS = Path(__file__).resolve().parent / "vectors"  # vendored: see tests/vectors/PROVENANCE.md
DUALAR_SETS = ["dualar-s1-tiny", "dualar-s2-tiny"]


def vector_set(name: str) -> Path:
    path = VECTORS / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"reference vectors not found at {path} (the vendored reference vectors are part of the repository)"
        )
    return path


def demo_copies(folder: Path, copies: int) -> list[str]:
    """The demo table `copies` times over (ids made unique: `<id>-<k>`) beside a copy of its
    clips, written to `folder/demo.parquet`; the ids, in order."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(DEMO_TABLE)
    ids = table.column("id").to_pylist()
    tables = [table.set_column(0, "id", pa.array([f"{i}-{k}" for i in ids])) for k in range(copies)]
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DEMO_TABLE.parent / "refs", folder / "refs", dirs_exist_ok=True)
    pq.write_table(pa.concat_tables(tables), folder / "demo.parquet")
    return [f"{i}-{k}" for k in range(copies) for i in ids]


def start_driver(overrides: list[str], env: dict) -> subprocess.Popen:
    """`python -m pipeline <overrides>` started in the background, its output in `.stdout`
    (text, stderr with it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_module(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m <args>` from the repo root, as a user would."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


# The device engine tests load their models on: scripts/gpu_check.sh sets it to "cuda".
TEST_DEVICE = os.environ.get("CHORUS_TEST_DEVICE", "cpu")


def decide_rows(
    path, distributed: bool = False, output=None, settings: str = "settings", retry_errors=False, retry_rejected=False
):
    """Every input row of the table at `path` with its planning decision (pipeline/planner.py)
    against the output directory `output` (if any), by the in-process or the distributed plan."""
    import pyarrow.fs as pafs

    from pipeline.output.layout import OutputLayout
    from pipeline.plan.decide import decide, output_key_files
    from pipeline.plan.inputs import scan_input
    from pipeline.plan.keys import RowHasher
    from pipeline.plan.rules import Retry

    scan = scan_input(str(path), {})
    files = output_key_files(OutputLayout(str(output)).live_files()) if output is not None else []
    hasher = RowHasher(settings, None, scan.root)
    decided = decide(scan, hasher, files, pafs.LocalFileSystem(), Retry(retry_errors, retry_rejected), distributed)
    return decided.to_table()


def hashes(path, settings: str) -> dict:
    """Each input row's content hash (id -> hash) under the settings digest `settings`."""
    from actors import schema as S

    decided = decide_rows(path, settings=settings)
    return dict(zip(decided.column(S.ID).to_pylist(), decided.column(S.CONTENT_HASH).to_pylist()))


def random_codes(sizes, frames: int, seed: int, batch=None):
    """Codes [C, frames] (or [batch, C, frames], the same rows repeated) drawn within each
    codebook's size."""
    import numpy as np

    generator = np.random.default_rng(seed)
    codes = np.stack([generator.integers(0, size, size=frames) for size in sizes]).astype(np.int64)
    return codes if batch is None else np.stack([codes] * batch)


def ok_row(row_id: str, seconds: float = 0.25, rate: int = 44100) -> dict:
    """An ok output row of `seconds` of FLAC audio, as an actor writes it."""
    import io

    import numpy as np
    import soundfile as sf

    from actors import schema as S

    wave = (0.2 * np.sin(np.arange(int(seconds * rate)) / 7.0)).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, wave, rate, format="FLAC")
    return {
        S.ID: row_id,
        S.STATUS: S.STATUS_OK,
        S.AUDIO: {S.AUDIO_BYTES: buffer.getvalue(), S.AUDIO_PATH: None},
        S.SAMPLE_RATE: rate,
        S.AUDIO_SECONDS: seconds,
        S.N_FRAMES: int(seconds * 21.5),
        S.RUN: "r1",
        S.ACTOR: "actor-1",
        S.RTF: 0.5,
    }


def within_sketch_bound(values, q: float, got) -> bool:
    """Whether `got` is the q-th percentile of the finite `values` to pipeline/sketch.py's
    bound: within RELATIVE_ERROR of the larger of the two ranks it interpolates between."""
    import numpy as np

    from pipeline.report.sketch import RELATIVE_ERROR

    ordered = np.sort(np.asarray([v for v in values if v is not None], dtype=np.float64))
    ordered = ordered[np.isfinite(ordered)]
    if not len(ordered):
        return got is None
    h = q / 100 * (len(ordered) - 1)
    lo, hi = ordered[int(np.floor(h))], ordered[int(np.ceil(h))]
    return abs(got - np.percentile(ordered, q)) <= RELATIVE_ERROR * max(abs(lo), abs(hi)) + 1e-12


def _same(a, b, where: str) -> None:
    """Equal, floats to 1e-9 relative (sums in another order), recursively."""
    import math

    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, a, b)
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, (int, float)):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (where, a, b)
    else:
        assert a == b, (where, a, b)


def assert_same_summary(exact: dict, sketched: dict, table, run_id: str) -> None:
    """summary.json's exact and sketched versions say the same: every count and sum equal,
    each percentile within the sketch's bound of the rows' own (`table`: the summary columns
    of the output they describe), and their "percentiles" saying which they are."""
    rows = table.to_pylist()
    exact, sketched = dict(exact), dict(sketched)
    assert exact.pop("percentiles") == "exact" and sketched.pop("percentiles").startswith("sketch")
    per_actor, sketched_actors = exact.pop("per_actor"), sketched.pop("per_actor")
    assert list(per_actor) == list(sketched_actors)
    for actor, figures in per_actor.items():
        figures, theirs = dict(figures), dict(sketched_actors[actor])
        figures.pop("row_rtf_p50")
        rtf = [r["rtf"] for r in rows if r["actor"] == actor and r["run"] == run_id and r["status"] == "ok"]
        assert within_sketch_bound(rtf, 50, theirs.pop("row_rtf_p50")), actor
        _same(figures, theirs, f"per_actor.{actor}")
    quality, sketched_quality = dict(exact.pop("quality")), dict(sketched.pop("quality"))
    distributions, sketched_distributions = quality.pop("metrics"), sketched_quality.pop("metrics")
    _same(quality, sketched_quality, "quality")
    assert list(distributions) == list(sketched_distributions)
    for name, figures in distributions.items():
        _same(figures["mean"], sketched_distributions[name]["mean"], f"{name}.mean")
        for key in figures:
            if key != "mean":
                got = sketched_distributions[name][key]
                assert within_sketch_bound([r[name] for r in rows], float(key[1:]), got), (name, key, got)
    _same(exact, sketched, "summary")


# ---- headless Chromium: the report page as a browser shows it ----------------------------
CHROMIUM = Path("/usr/bin/chromium")  # Debian's package (.ci/run installs it)

# Appended to a copy of a page: loads and plays every <audio>, then publishes what each did in
# <pre id="chorus-audio-check"> (read from --dump-dom).
CHECK_SCRIPT = """
<script>
console.error("%(canary)s");
(function () {
  const audios = Array.from(document.querySelectorAll("audio"));
  const results = [];
  let pending = audios.length;
  function publish() {
    const pre = document.createElement("pre");
    pre.id = "chorus-audio-check";
    pre.textContent = JSON.stringify(results);
    document.body.appendChild(pre);
    document.title = "checked";
  }
  function settle(r) { results.push(r); if (--pending === 0) publish(); }
  if (!pending) publish();
  audios.forEach(function (a) {
    const cell = a.closest("tr") && a.closest("tr").querySelector("td.id");
    const r = {id: cell ? cell.textContent : null};
    a.addEventListener("loadedmetadata", function () {
      r.readyState = a.readyState; r.duration = a.duration; a.muted = true;
      a.play().then(function () { r.played = true; a.pause(); settle(r); },
                    function (e) { r.played = false; r.playError = String(e); settle(r); });
    }, {once: true});
    a.addEventListener("error", function () { r.error = a.error ? a.error.code : -1; settle(r); }, {once: true});
    a.load();
  });
})();
</script>
"""


def chromium(args: list[str], profile: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--mute-audio",
        "--autoplay-policy=no-user-gesture-required",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def console_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]


HOST_DISK_NOTICE = "file_system_monitor.cc"  # the raylet's "disk over 95% full": the host's, not chorus's


def run_lines(stderr: str) -> list[str]:
    """A run's stderr lines less the raylet's notices that the machine's disk is nearly full, which
    a busy CI host prints whatever the run does."""
    return [ln for ln in stderr.strip().splitlines() if HOST_DISK_NOTICE not in ln]


def noisy_lines(stderr: str, *markers: str) -> list[str]:
    """The run's own lines holding any of `markers` ("Traceback", "WARNING", " E " for a Ray C++
    error line)."""
    return [ln for ln in run_lines(stderr) if any(m in ln for m in markers)]


def audio_check(page: Path, work: Path) -> tuple[list[dict], list[str]]:
    """Every <audio> of the page at `page` loaded and played in headless Chromium: (one result
    per player: id, readyState, duration, played or error; the console lines other than the
    probe's own canary)."""
    canary = f"chorus-canary-{uuid.uuid4().hex}"
    probe = work / f"probe-{canary}.html"
    doc = page.read_text(encoding="utf-8")
    probe.write_text(doc.replace("</body>", CHECK_SCRIPT % {"canary": canary} + "</body>"), encoding="utf-8")
    proc = chromium(["--dump-dom", probe.as_uri()], work / f"profile-{canary}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = console_lines(proc.stderr)
    assert any(canary in ln for ln in lines), proc.stderr[-2000:]  # console capture works
    m = re.search(r'<pre id="chorus-audio-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the probe did not finish: " + proc.stdout[-500:]
    return json.loads(html.unescape(m.group(1))), [ln for ln in lines if canary not in ln]


# ---- a synthetic run's output (the report tests) ---------------------------------------
SR = 24000
EVIL_ID = '<script>alert("id")</script>&\'"'
EVIL_TEXT = 'Hello </td></table><script>alert(1)</script><img src=x onerror=alert(2)> & "bye"'
EVIL_ERROR = "RuntimeError: <b>bold</b> & broken"
COMMON_ERROR = "ValueError: text is empty"


def flac_tone(seconds: float, freq: float = 440.0) -> bytes:
    import io

    import numpy as np
    import soundfile as sf

    t = np.arange(int(round(SR * seconds))) / SR
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), SR, format="FLAC")
    return buf.getvalue()


def make_rows(
    n: int = 30, *, n_err: int = 4, audio_as: str = "bytes", finished_at: bool = True, out: Path | None = None
) -> list[dict]:
    """Rows shaped like chorus's output (docs/architecture.md §7). Row 0 is ok and has a hostile id and text; the
    last n_err rows are errors (three share one message, one is hostile)."""
    rows = []
    t0 = 1_700_000_000.0
    for i in range(n):
        rid = EVIL_ID if i == 0 else f"row-{i:03d}"
        row = {
            "id": rid,
            "text": EVIL_TEXT if i == 0 else f"Sentence number {i}.",
            "sample_rate": SR,
            "actor": f"actor-{i % 2}",
            "node": "node-a",
            "device": "cpu",
            "model": "tiny-s2",
            "seed": i,
            "queue_ms": 5.0 + i,
            "prefill_ms": 20.0 + i,
            "decode_ms": 300.0 + 10 * i,
            "codec_ms": 40.0,
        }
        if finished_at:
            row["finished_at"] = t0 + 0.35 * i
        if i >= n - n_err:
            msg = EVIL_ERROR if i == n - 1 else COMMON_ERROR
            row.update(
                status="error",
                error=msg,
                stop_reason="error",
                audio=None,
                n_frames=None,
                audio_seconds=None,
                total_ms=12.0,
                rtf=None,
            )
        else:
            seconds = 0.5 + 0.25 * (i % 5)
            data = flac_tone(seconds, 220.0 + 20 * i)
            if audio_as == "bytes":
                audio = {"bytes": data, "path": None}
            else:
                rel = f"audio/{i:03d} {rid[:1]}.flac"  # a space: the src must be URL-quoted
                (out / "audio").mkdir(parents=True, exist_ok=True)
                (out / rel).write_bytes(data)
                audio = {"bytes": None, "path": rel}
            total = row["queue_ms"] + row["prefill_ms"] + row["decode_ms"] + row["codec_ms"]
            row.update(
                status="ok",
                error=None,
                stop_reason="budget" if i % 7 == 3 else "eos",
                audio=audio,
                n_frames=int(seconds * 21.53),
                audio_seconds=seconds,
                total_ms=total,
                rtf=total / 1000 / seconds,
            )
        rows.append(row)
    return rows


def write_run(out: Path, rows: list[dict], *, summary: dict | None = None, split: int = 2) -> Path:
    """The rows as a run's output directory: `split` Parquet files with small row groups under
    data/ (all but the first one folder down), and summary.json if given."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    audio_type = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
    (out / "data" / "part-1").mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(len(rows)), split) if rows else [np.arange(0)]
    for k, idx in enumerate(chunks):
        part = [rows[i] for i in idx]
        table = pa.Table.from_pylist(part) if part else pa.table({"id": pa.array([], pa.string())})
        if "audio" in table.column_names:
            table = table.set_column(table.column_names.index("audio"), "audio", table.column("audio").cast(audio_type))
        # the second file sits one folder down: the report globs everything below data/
        sub = out / "data" / ("part-1" if k else "")
        pq.write_table(table, sub / f"{k:05d}.parquet", row_group_size=4)
    if summary is not None:
        (out / "summary.json").write_text(json.dumps(summary))
    return out


# ---- an actor called directly (tests/synth, tests/quality) --------------------------------
def plant(monkeypatch, actor, fault) -> list:
    """Before a decoded row is measured, `fault(job, round, wave, task)` may give another wave in
    its place (round: how many decoded rounds the row had before this one; task: its HearTask).
    The actor must decode in its own process (engine.codec_process=false), so the planted
    `hearing.listen` is the one the finisher's hearing calls. Returns the (id, round)s seen."""
    from actors.quality import hearing

    hear, listen, seen, in_hand = actor.finisher.hear, hearing.listen, [], {}

    def planted_hear(jobs):
        in_hand.clear()
        in_hand.update({id(job.result.codes): job for job in jobs})
        return hear(jobs)

    def planted_listen(task, wave, *args):
        job = in_hand[id(task.codes)]
        seen.append((job.spec.id, len(job.rounds)))
        return listen(task, fault(job, len(job.rounds), wave, task), *args)

    monkeypatch.setattr(actor.finisher, "hear", planted_hear)
    monkeypatch.setattr(hearing, "listen", planted_listen)
    return seen


def tune(monkeypatch, actor, group: str, **changes) -> None:
    """A variant of one of the actor's settings groups, for one test (every part reads it)."""
    from dataclasses import replace

    monkeypatch.setattr(actor.settings, group, replace(getattr(actor.settings, group), **changes))


def text_rows(specs: list[dict]):
    """Input rows of id, text, seed and max_frames (any may be missing) as the actor reads them."""
    import pyarrow as pa

    from actors import schema as S

    schema = pa.schema([(S.ID, pa.string()), (S.TEXT, pa.string()), (S.SEED, pa.int64()), (S.MAX_FRAMES, pa.int64())])
    return pa.Table.from_pylist(specs, schema=schema)


def export_source(folder: Path, rows: list[dict], block_rows: int = 4):
    """A finished chorus output holding `rows` (output rows, dicts) in parts of `block_rows`: its
    marker, the parts, and summary.json counting them, as a run's end leaves it."""
    import json

    from actors import schema as S
    from pipeline.names import IDENTITY_FILE, SUMMARY_FILE
    from pipeline.output.layout import OutputLayout
    from pipeline.output.parts import write_block

    layout = OutputLayout(str(folder))
    layout.ensure()
    layout.write_text(IDENTITY_FILE, json.dumps({"model": "demo", "checkpoint": "tiny"}))
    for start in range(0, len(rows), block_rows):
        write_block(S.output_table(rows[start : start + block_rows]), layout.location)
    layout.write_text(SUMMARY_FILE, json.dumps({"rows_total": len(rows)}))
    return layout


def export_cluster(distributed_rows: int):
    """An export's Ray settings (pipeline/config.py ExportCluster): a local Ray of 2 CPUs, used
    for outputs of at least `distributed_rows` rows."""
    from pipeline.config import ExportCluster

    return ExportCluster(num_cpus=2, distributed_rows=distributed_rows)


def export_in_process():
    """An in-process export's Ray settings: every test output is below distributed_rows. A
    function, not a constant: this module is imported where Hydra is not installed (the GPU
    check's image), and pipeline.config imports it."""
    return export_cluster(1_000_000)


def export_settings(fmt: str = "files", dest=None, **more):
    """The export group (pipeline/config.py ExportSettings) with `more` set, checked."""
    from pipeline.config import export_settings as checked

    return checked(format=fmt, dir=None if dest is None else str(dest), progress_interval_s=0.0, **more)


def two_voice_flac(seconds: float, rate: int = 44100):
    """A per-speaker row's audio: voice 0 in the first half on channel 0, voice 1 in the second on
    channel 1, exact zeros elsewhere; (the wave, its 16-bit FLAC bytes)."""
    import io

    import numpy as np
    import soundfile as sf

    half = int(seconds * rate) // 2
    wave = np.zeros((2 * half, 2), dtype=np.float32)
    wave[:half, 0], wave[half:, 1] = 0.25, -0.25
    buffer = io.BytesIO()
    sf.write(buffer, wave, rate, format="FLAC", subtype="PCM_16")
    return wave, buffer.getvalue()


def first_seen(output: str, stop, seen: dict, every_s: float = 0.1) -> None:
    """Until `stop` is set, poll the output's live files and note when each id first shows up
    in one (unix time, into `seen`): what a user, or a crash, finds on disk while a run goes on."""
    import time

    import pyarrow as pa

    from pipeline.output.layout import OutputLayout

    layout = OutputLayout(output)
    while not stop.is_set():
        try:
            ids = layout.done_ids().to_pylist()
        except (OSError, pa.ArrowInvalid):  # a part compacted away between listing and reading
            ids = []
        now = time.time()
        for row_id in ids:
            seen.setdefault(row_id, now)
        stop.wait(every_s)


@contextlib.contextmanager
def watching_output(output: str):
    """While the block runs, `first_seen` in a thread of its own; yields its `seen` dict (id ->
    the unix time it first showed up on disk), complete once the block has left."""
    seen: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=first_seen, args=(output, stop, seen), daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()
