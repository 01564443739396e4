"""The dtype names a model or codec may be loaded in, free of torch: the settings check them
(the driver imports those, and never torch) and actors/precision.py maps them to torch's."""

from __future__ import annotations

AUTO = "auto"  # not a dtype: the rule in actors/precision.py picks one per device

DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float64": "float64",
    "fp64": "float64",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
