"""Parallelism of frontier runs: context parallelism (and, to come, mixture of experts and expert parallelism): the modules of part 2c (see :mod:`utils.parallel`)."""
