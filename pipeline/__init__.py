"""chorus's driver: Hydra entry points, input checks, the Ray Data plan, output layout,
resume, progress. It never imports torch (the actors load it), so it starts fast and runs
on machines without it.

    python -m pipeline [overrides]          synthesize (defaults: the built-in demo)
    python -m pipeline.export output.dir=D  one audio file per output row
"""
