"""Planning a run: transformer costs, the layout planner and published runs: the modules of chapters 10 planning a training run of part 2 (see :mod:`utils.parallel`)."""
