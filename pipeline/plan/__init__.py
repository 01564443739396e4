"""Planning: what a job does with each input row, before any synthesis. The input scanned
(inputs: files, fragments), each row's keys (keys: id problems, content hash, clip), what the
output is bound to (identity), the rules (rules: rejected / new / done / changed / retry),
the decision in-process or as Ray Data work (decide), the rows to synthesize per fragment
(todo), the sums (counts), what the plan writes under the output (records), and the whole
step (job: plan_job). "Plan" means this and only this: every input row's decision.

May import: pipeline's leaves (location, names, errors, config, cluster) and pipeline.output;
never pipeline.run or pipeline.report (tests/test_layering.py)."""
