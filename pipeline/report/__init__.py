"""What an output says about itself: the figures of output rows (metrics, sketch for
mergeable percentiles, quality_figures for the gate), summary.json exactly (summary_figures,
summary) or from per-file partials merged on the driver (summary_merge), and report.html
(page, from page_data's reading, plots, markup, sample). `python -m pipeline.report` writes
the page for any output directory.

May import: pipeline's leaves, pipeline.output, actors' torch-free modules (schema, quality's
flags and ordering), pyarrow, numpy, matplotlib's object API; never pipeline.plan or
pipeline.run (tests/test_layering.py)."""
