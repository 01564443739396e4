"""`python -m pipeline.export`: a chorus output where training stacks read it -- one audio file
per row (`files`), WebDataset tar shards, Lhotse Shar, Hugging Face Hub-layout Parquet, or NeMo
manifests -- filtered by status and the quality columns, with the columns chosen and the rows in
named splits by a hash of their id, as Ray Data work across the cluster.

    plan.py       the work units: runs of the live files' row groups, from their footers
    filters.py    which rows go out (export.status, the quality thresholds), and what each removed
    splits.py     which split a row goes to (export.splits: a hash of its id)
    formats.py    what the formats share: the registry, the per-row metadata, shard cutting
    files.py, webdataset.py, lhotse_shar.py, hf.py, nemo.py    each format's pieces, names, last files
    destination.py  the export directory: its record, staging, publishing, starting over
    task.py       one work unit, in a Ray task: read, filter, write pieces, record them
    job.py        the driver: checks, plan, the Ray Data pass and its progress, publish, finish

The driver holds one entry per work unit (a shard's worth of rows), never per row. Every file
appears whole under its final name: pieces are written to .chorus-staging/, each unit's record
committed after its pieces, and published (renamed; on an object store copied) once every unit
is done, numbered in plan order. So a rerun over a finished export changes nothing, and a
killed one resumes: finished units are kept, the rest written again, nothing twice.

May import: pipeline's leaves and pipeline/output/ (the live files, the lease), actors' torch-free
modules, pyarrow, and Ray, lhotse inside the functions that use them. Nothing imports it but
its command line.
"""
