"""Where a machine's CPU goes during a run: CPU cores used by each group of processes and
threads over a window, read from /proc (Linux), with each group's nice value.

    python scripts/cpu_budget.py --seconds 12 [--json out.json]

Run it while a job or `python -m pipeline.bench` is in its steady part. Groups: the synthesis
actor's engine thread (its busiest thread) and its other threads, the codec's child process,
the driver, Ray's raylet + GCS, Ray's dashboard/agents/monitors, each kind of Ray worker
(Ray Data's writers, read-ahead, stats actors, idle workers), everything else. On a 2-vCPU
machine the total says how close the run is to the machine's limit and who shares it with the
engine (docs/performance.md, "The audio work in the codec's child").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

ACTOR_MARK = "SynthStage"  # the synthesis actors' process title: ray::MapWorker(MapBatches(SynthStage))


def _threads() -> dict:
    """(pid, tid) -> (CPU ticks, command line, nice) of every thread now."""
    seen = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                # after the command's ")": state is field 0, utime 11, stime 12, nice 16
                seen[(int(pid), int(tid))] = (int(fields[11]) + int(fields[12]), command, int(fields[16]))
        except (FileNotFoundError, ProcessLookupError, IndexError):  # gone meanwhile
            pass
    return seen


def _group(command: str, is_engine: bool) -> str:
    if ACTOR_MARK in command:
        return "actor: engine thread" if is_engine else "actor: other threads"
    if "actors.synth.codec_process" in command:
        return "codec child"
    if "pipeline." in command or "chorus" in command:
        return "driver"
    if "raylet" in command or "gcs_server" in command:
        return "raylet + gcs"
    if any(name in command for name in ("dashboard", "agent", "monitor")):
        return "ray dashboard, agents, monitors"
    if command.startswith("ray::"):
        return "ray worker: " + command[5:].split("(")[0].split()[0]
    return "other"


def measure(seconds: float) -> dict:
    before = _threads()
    time.sleep(seconds)
    after = _threads()
    ticks = os.sysconf("SC_CLK_TCK")
    used = {key: (after[key][0] - before.get(key, (0,))[0]) / ticks for key in after}
    actor_threads = [key for key in after if ACTOR_MARK in after[key][1]]
    engine = max(actor_threads, key=used.get) if actor_threads else None
    cores = collections.Counter()
    nice: dict = {}
    for key, spent in used.items():
        if spent > 0:
            name = _group(after[key][1], key == engine)
            cores[name] += spent / seconds
            nice.setdefault(name, set()).add(after[key][2])
    groups = [{"group": g, "cores": round(c, 4), "nice": sorted(nice[g])} for g, c in cores.most_common()]
    return {"seconds": seconds, "cpus": os.cpu_count(), "total_cores": round(sum(cores.values()), 4), "groups": groups}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    report = measure(args.seconds)
    for g in report["groups"]:
        print(f"{g['cores']:6.3f} cores  {g['group']}  (nice {','.join(map(str, g['nice']))})")
    print(f"{report['total_cores']:6.3f} cores  in all, of {report['cpus']}, over {args.seconds:g} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
