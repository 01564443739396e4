"""`python -m pipeline.bench`: the end-to-end pipeline on a generated workload (workload), once
per (actors, slots) configuration (sweep), each measured from its output rows (measure)
against the same rows through the engine alone. May import anything of the driver."""
