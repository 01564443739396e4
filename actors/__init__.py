"""chorus actors: the engine (actors.engine), the codec (actors.codec) and the Ray Data
callable class. Importing this package must not import torch: the driver imports it.

Its layers, each importing only its own and those below it (tests/test_layering.py refuses an
arrow back up, lazy and TYPE_CHECKING imports included); nothing here imports `pipeline`:

    synth/     the actor (SynthActor) and its parts          -> quality/, engine/, codec/, leaves
    quality/   the quality gate, its checks and settings     -> engine/, codec/, leaves
    engine/    the dual-AR model and its batching engine     -> leaves
    codec/     the codec (audio <-> codes)                   -> leaves
    leaves     the top-level modules (schema, input_types, audio, precision, dtype_names,
               demo, files, memory, native, modules, ...) and storage/   -> leaves only

The engine and the codec import neither each other: what both need (the dtype rule, the
shared building blocks) is a leaf."""
