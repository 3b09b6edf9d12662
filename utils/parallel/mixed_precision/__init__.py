"""Number formats, loss scaling and FP8 scaling: the modules of chapters 09 mixed precision of part 2 (see :mod:`utils.parallel`)."""
