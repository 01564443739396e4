"""The output directory and everything written into it: where its files are and who owns it
(layout, lease), the block parts and their stats (parts), the listing of live files
(listing), reading rows back (reading), packing parts into shards while a job runs and at its
end (shards, compaction), the run's end that leaves each id on disk once (supersede), the
Hugging Face features metadata (hf_features). Exports of it: pipeline/export/.

May import: pipeline's leaves (location, names, errors, cluster), actors' torch-free modules
(schema, files), pyarrow, and Ray inside the functions that run on it. Never imports
pipeline.plan, pipeline.run or pipeline.report: the output is below them all
(tests/test_layering.py)."""
