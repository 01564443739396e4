"""chorus's driver. It never imports torch (the actors load it), so it starts fast and runs on
machines without it.

    python -m pipeline [overrides]            synthesize (defaults: the built-in demo)
    python -m pipeline.preview [overrides]    what a run would do, planned, nothing written
    python -m pipeline.export output.dir=D    the rows as files, WebDataset, Lhotse Shar or HF Parquet
    python -m pipeline.encode_refs OUT ...    the input with its reference clips encoded
    python -m pipeline.report OUTPUT_DIR      report.html for an output directory
    python -m pipeline.bench bench=...        the end-to-end benchmark

Rooms, and their one-way doors (each package's docstring says what it may import;
tests/test_layering.py holds them and refuses any import cycle):

    leaves    location (paths, URIs, filesystems), names (every output file name),
              errors (the user errors), config (the run's schema; config_page and
              schema_comments: every key's page and --help), cluster (the one Ray
              connection, driver-side task resources, the in-process/distributed choice)
    output/   the output directory: layout, lease, parts, shards, the run's end, export
    plan/     every input row's decision before synthesis       -> output, leaves
    report/   summary.json and report.html from an output       -> output, leaves
    run/      one run's steps and its synthesis stream           -> plan, report, output, leaves
    export/   an output where training stacks read it, as Ray Data work  -> output, leaves
    bench/, and the entry modules above                          -> anything
"""
