"""Parallelism of frontier runs: context parallelism (ring attention, Ulysses), mixture of experts and expert parallelism: the modules of chapters 10-12 of part 2 (see :mod:`utils.parallel`)."""
