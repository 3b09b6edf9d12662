"""Collectives and the networks that carry them: the modules of chapters 02 collectives and 05 GPU networking of part 2 (see :mod:`utils.parallel`)."""
