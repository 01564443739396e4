"""Memory over a long job: the demo job on a large generated input for a set time, the resident
memory of every process it runs sampled every --every-s seconds, and the slope of each after warm-up.

    .venv/bin/python scripts/bench_soak.py [--minutes 20] [--warmup-min 6] [--rows 1000000]
        [--every-s 60] [--until MIN ...] [--work DIR] [--out DIR] [--tree DIR] [overrides ...]

The job is `python -m pipeline` on a fresh output, in its own process group; its input comes
from scripts/make_scale_input.py (reference clips included: the reference caches are part of
what is measured). Each sample reads /proc (Linux): the driver (the job's process), every Ray
Data actor running the synthesis stage (SynthStage), every codec child
(`actors.synth.codec_process`), and, for context, the rest of Ray (GCS, raylet, dashboard, idle
workers) as one sum. Also sampled: the rows in the output (from the live files' footers) and
the driver's blocks finished.

Writes OUT/soak.json (the series, per-process slopes in MB/min over minutes >= warmup by least
squares, MB per 1,000 rows finished over the same span) and OUT/soak.html (RSS over time, one
line per process). Slopes are per wall minute, and the job's speed sets how many rows a minute
is: read the per-1,000-rows figure beside it when comparing machines.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import platform
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from pipeline.output.layout import OutputLayout  # noqa: E402
from pipeline.report.plots import Plots  # noqa: E402
from scripts.bench_job_scale import stop_process_group  # noqa: E402

MEASURES = ("rss", "anon", "shmem")


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:  # the process exited between the listing and the read
        return ""


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process now."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        found[int(name)] = (parent, _read(f"/proc/{name}/cmdline").replace("\x00", " ").strip())
    return found


def memory_mb(pid: int) -> dict | None:
    """Resident memory in MB: `rss` (all of it), `anon` (the process's own heap and stacks) and
    `shmem` (shared memory mapped in: Ray's object store pages a process has touched count in
    its RSS, so RSS climbs as it reads objects until the store's size, with no leak behind it)."""
    fields = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem"):
            fields[key] = int(value.split()[0]) / 1024.0
    if "VmRSS" not in fields:
        return None
    return {"rss": fields["VmRSS"], "anon": fields.get("RssAnon", 0.0), "shmem": fields.get("RssShmem", 0.0)}


def role(command: str) -> str:
    """What a process of the job is, from its command line (Ray sets a worker's to its task or
    actor: `ray::MapWorker(MapBatches(SynthStage))`, `ray::IDLE`, ...)."""
    if "actors.synth.codec_process" in command:
        return "codec"
    if command.startswith("ray::") and ("SynthStage" in command or "SynthActor" in command):
        return "actor"
    return "ray"


def descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def sample(driver: int) -> dict:
    """One sample: every process of the job's tree by role and pid (the raylet starts the workers
    and the driver starts the raylet, so one tree holds them all); the rest of Ray summed."""
    table = processes()
    entry = {"driver": memory_mb(driver), "actor": {}, "codec": {}, "ray": dict.fromkeys(MEASURES, 0.0)}
    for pid in descendants(driver, table):
        kind, memory = role(table[pid][1]), memory_mb(pid)
        if memory is None:
            continue
        if kind == "ray":
            entry["ray"] = {k: entry["ray"][k] + memory[k] for k in MEASURES}
        else:
            entry[kind][str(pid)] = memory
    return entry


def rows_done(output: str) -> int:
    try:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(path).metadata.num_rows for path in OutputLayout(output).live_files())
    except Exception:  # a file replaced between the listing and the read: next sample counts it
        return -1


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points; None below three points."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def series(samples: list[dict]) -> dict[str, list[tuple[float, dict]]]:
    """Name -> (minute, memory) points: the driver, each actor and codec child by pid, the rest
    of Ray as one sum."""
    lines: dict[str, list[tuple[float, dict]]] = {}
    for s in samples:
        if s["memory"]["driver"] is not None:
            lines.setdefault("driver", []).append((s["minute"], s["memory"]["driver"]))
        for kind in ("actor", "codec"):
            for pid, memory in s["memory"][kind].items():
                lines.setdefault(f"{kind} {pid}", []).append((s["minute"], memory))
        lines.setdefault("rest of ray (sum)", []).append((s["minute"], s["memory"]["ray"]))
    return lines


def figures(samples: list[dict], warmup_min: float, until_min: float = float("inf")) -> dict:
    """Per process and measure: MB at warm-up and last, peak, slope MB/min after warm-up (up to
    `until_min`), and the same slope per 1,000 rows finished."""
    samples = [s for s in samples if s["minute"] <= until_min]
    after = [s for s in samples if s["minute"] >= warmup_min]
    rows_per_min = slope([(s["minute"], s["rows"]) for s in after if s["rows"] >= 0])
    out = {"rows_per_min_after_warmup": rows_per_min, "processes": {}}
    for name, points in series(samples).items():
        late = [(m, memory) for m, memory in points if m >= warmup_min]
        out["processes"][name] = {}
        for measure in MEASURES:
            per_min = slope([(m, memory[measure]) for m, memory in late])
            out["processes"][name][measure] = {
                "mb_at_warmup": late[0][1][measure] if late else None,
                "mb_last": late[-1][1][measure] if late else None,
                "mb_peak": max(memory[measure] for _, memory in points),
                "slope_mb_per_min": per_min,
                "mb_per_1k_rows": per_min / rows_per_min * 1000 if per_min is not None and rows_per_min else None,
            }
    return out


def table_rows(result: dict) -> list[list[str]]:
    """process, measure, MB at warm-up, last, peak, MB/min, MB per 1k rows (a row per pair)."""

    def text(v, digits):
        return "-" if v is None else f"{v:.{digits}f}"

    out = []
    for name, measures in result["figures"]["processes"].items():
        for measure, v in measures.items():
            out.append(
                [name, measure, text(v["mb_at_warmup"], 0), text(v["mb_last"], 0), text(v["mb_peak"], 0)]
                + [text(v["slope_mb_per_min"], 3), text(v["mb_per_1k_rows"], 3)]
            )
    return out


HEADERS = ["process", "measure", "MB at warm-up", "MB last", "MB peak", "MB/min after warm-up", "MB per 1k rows"]


def page(samples: list[dict], result: dict) -> str:
    plots = Plots()
    with plots.style():
        fig, axes = plots.figure(rows=2, height=3.2)
        for ax, measure in zip(axes, ("rss", "anon")):
            for name, points in series(samples).items():
                ax.plot([m for m, _ in points], [memory[measure] for _, memory in points], marker=".", label=name)
            ax.axvline(result["warmup_min"], color="grey", linestyle="--", linewidth=0.8)
            ax.set_ylabel(f"{measure} (MB)")
        axes[0].set_title("resident memory (rss) and its private part (anon) per process")
        axes[-1].set_xlabel("minutes since the job started")
        axes[0].legend(fontsize=7)
        svg = plots.svg(fig, "soak")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table_rows(result))
    return (
        f"<!doctype html><meta charset='utf-8'><title>chorus soak</title><h1>chorus soak</h1>"
        f"<p>{html.escape(result['cpu'])}, {result['minutes']} min, {result['rows_finished']} rows finished, "
        f"overrides {html.escape(' '.join(result['overrides']) or 'none')}; slopes by least squares over minutes "
        f"&ge; {result['warmup_min']} (dashed line).</p>{svg}<table><tr>{head}</tr>{body}</table>"
    )


def cpu_name() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def make_input(work: str, rows: int) -> str:
    data = os.path.join(work, f"input-{rows}")
    if not os.path.exists(os.path.join(data, "expected.json")):
        make = [sys.executable, os.path.join(REPO, "scripts", "make_scale_input.py"), str(rows), data]
        subprocess.run(make, check=True, stdout=subprocess.DEVNULL)
    return data


def soak(args) -> tuple[list[dict], float]:
    data, output = make_input(args.work, args.rows), os.path.join(args.work, "output")
    subprocess.run(["rm", "-rf", output], check=True)
    log = open(os.path.join(args.out, "soak-job.log"), "wb")
    command = [sys.executable, "-m", "pipeline", f"data.path={data}", f"output.dir={output}", *args.overrides]
    job = subprocess.Popen(
        command,
        cwd=args.tree,
        env=dict(os.environ, PYTHONPATH=args.tree),
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    began, samples = time.monotonic(), []
    try:
        while (minute := (time.monotonic() - began) / 60.0) <= args.minutes:
            if job.poll() is not None:
                raise RuntimeError(f"the job ended (status {job.returncode}) after {minute:.1f} min: see soak-job.log")
            samples.append({"minute": round(minute, 3), "rows": rows_done(output), "memory": sample(job.pid)})
            print(json.dumps(samples[-1]), flush=True)
            time.sleep(max(0.0, began + len(samples) * args.every_s - time.monotonic()))
    finally:
        stop_process_group(job, 60)
    return samples, (time.monotonic() - began) / 60.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--warmup-min", type=float, default=6.0)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--every-s", type=float, default=60.0)
    parser.add_argument("--work", default="/tmp/chorus-soak")
    parser.add_argument("--out", default="soak")
    parser.add_argument("--tree", default=REPO)
    parser.add_argument(
        "--until", type=float, action="append", default=[], help="also slopes over warm-up..MIN (repeatable)"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    samples, ran = soak(args)
    result = {
        "cpu": f"{cpu_name()}, {os.cpu_count()} cpus",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "tree": args.tree,
        "overrides": args.overrides,
        "minutes": round(ran, 1),
        "warmup_min": args.warmup_min,
        "rows_finished": max(s["rows"] for s in samples),
        "figures": figures(samples, args.warmup_min),
        # the same slopes over shorter spans, e.g. a long soak's minutes 6-20 beside its whole run
        "figures_until": {str(m): figures(samples, args.warmup_min, m) for m in args.until},
        "samples": samples,
    }
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "soak.html"), "w") as f:
        f.write(page(samples, result))
    print("| " + " | ".join(HEADERS) + " |")
    print("|---|---|" + "---:|" * (len(HEADERS) - 2))
    for row in table_rows(result):
        print("| " + " | ".join(row) + " |")
    print(f"rows/min after warm-up: {result['figures']['rows_per_min_after_warmup']}")
    for until, part in result["figures_until"].items():
        slopes = {n: round(v["rss"]["slope_mb_per_min"] or 0, 3) for n, v in part["processes"].items()}
        print(f"rss MB/min over minutes {args.warmup_min}-{until}: {slopes}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
