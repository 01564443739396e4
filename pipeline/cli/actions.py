"""What each `chorus` command does once its settings are typed and checked: a function of the
typed config that returns the exit status (pipeline/cli/exits.py). The work's modules are
imported here, inside each function, so that --help and a refusal import none of them."""

from __future__ import annotations

import json
import logging

from actors import schema as S
from actors.errors import ConfigError

from ..config import ChorusConfig, ExportConfig, ReportConfig, as_yaml
from ..location import check_writable, local_path
from . import exits

log = logging.getLogger("chorus")


def run(config: ChorusConfig) -> int:
    """`chorus run`: 0 when every row of the output is ok, 3 when some end in output.fail_on."""
    from ..run.steps import run as run_job

    report = run_job(config)  # below here the driver reads ChorusConfig
    print(f"chorus: output written to {report.output} (summary: {report.output}/summary.json)", flush=True)
    counts = {S.STATUS_ERROR: report.summary["rows_error"], S.STATUS_REJECTED: report.summary["rows_rejected"]}
    failing = {status: counts[status] for status in config.output.fail_on if counts[status]}
    if not failing:
        return exits.OK
    said = ", ".join(f"{rows} {status}" for status, rows in failing.items())
    log.warning("%s row(s) in the output: exit status 3 (output.fail_on=[] accepts them)", said)
    return exits.ROWS_FAILED


def preview(config: ChorusConfig) -> int:
    from ..preview import preview as plan_preview

    plan_preview(config)
    return exits.OK


def bench(config: ChorusConfig) -> int:
    from ..bench.sweep import run_bench

    if not config.bench.enabled:
        raise ConfigError(
            "choose a benchmark: bench=smoke, bench=sweep, bench=overhead, bench=quality or bench=dialogue"
        )
    check_writable(config.output.dir, "output.dir")
    run_bench(config)
    return exits.OK


def encode_refs(config: ChorusConfig) -> int:
    """`chorus encode-refs OUT`: 3 when some rows' references could not be encoded."""
    from ..encode_refs import encode_refs as encode

    out = config.encode_refs.output
    if out is None:
        raise ConfigError("encode_refs.output is required: pass `chorus encode-refs OUT.parquet` (the table written)")
    check_writable(_folder_of(out), "encode_refs.output")
    counts = encode(out, config)
    log.info(
        "%d rows, %d references encoded, %d without codes (listed above); written to %s",
        counts["rows"],
        counts["encoded"],
        counts["failed"],
        counts["output"],
    )
    return exits.ROWS_FAILED if counts["failed"] else exits.OK


def export(config: ExportConfig) -> int:
    from ..export.job import export as export_rows

    if config.export.dir is not None:
        check_writable(config.export.dir, "export.dir")
    report = export_rows(config.output.dir, config.export, config.cluster)
    print(describe_export(report), flush=True)
    return exits.OK


def describe_export(report) -> str:
    """What an export wrote, and how many rows each filter removed."""
    s = report.summary
    removed = ", ".join(f"{key} {count:,}" for key, count in s["removed"].items()) or "none"
    index = "NeMo manifest(s)" if s.get("manifests") else "files.csv"
    what = f"{s['shards']} shard(s)" if s["shards"] else f"one file per row + {index}"
    lines = [
        f"chorus export: {s['rows']:,} rows ({s['audio_seconds'] / 3600:.2f} h of audio) in {report.destination}: "
        f"{what}" + (" -- already exported, nothing changed" if report.already_done else ""),
        f"  read {s['read']:,} rows; removed by filter: {removed}",
    ]
    if s.get("split_shares"):
        lines.append("  splits: " + ", ".join(f"{name} {c['rows']:,} rows" for name, c in s["splits"].items()))
    if s.get("urls"):
        lines.append(f"  read with webdataset.WebDataset({s['urls']!r})")
    return "\n".join(lines)


def report(config: ReportConfig) -> int:
    from ..report.page import write_report

    settings, bench = config.report, None
    if settings.bench is not None:
        try:
            with open(local_path(settings.bench), encoding="utf-8") as f:
                bench = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"report.bench={settings.bench!r} cannot be read as JSON: {e}") from None
        if not isinstance(bench, dict):
            raise ConfigError(f"report.bench={settings.bench!r}: expected a JSON object (chorus bench's bench.json)")
    try:
        path = write_report(
            config.output.dir, title=settings.title, max_audio_rows=settings.max_audio_rows, bench=bench
        )
    except FileNotFoundError as e:
        raise ConfigError(f"output.dir: {e}; pass the folder a run wrote") from None
    print(path)
    return exits.OK


def show_config(config: ChorusConfig) -> int:
    print(as_yaml(config), end="")
    return exits.OK


def _folder_of(location: str) -> str:
    """The folder a file is written into (local; a URI as it is)."""
    import os

    from ..location import is_local

    return os.path.dirname(local_path(location)) if is_local(location) else location
