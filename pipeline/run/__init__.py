"""A synthesis run: its steps from the checks to the report (steps), its fixed facts
(context), the actors' settings (actor_settings), the synthesis stream (synthesis), the read
of the chosen rows (chosen_rows) behind the read-ahead window (readahead), progress, and the
trim of Ray Data's per-block stats (executor_stats).

May import: pipeline's leaves, pipeline.output, pipeline.plan, pipeline.report (the run ends
by writing the summary and the page), and actors.synth lazily, inside Ray (the driver never
loads torch). Nothing below it imports it (tests/test_layering.py)."""
