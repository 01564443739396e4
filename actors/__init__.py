"""chorus actors: the engine (actors.engine), the codec (actors.codec) and the Ray Data
callable class. Importing this package must not import torch: the driver imports it."""
