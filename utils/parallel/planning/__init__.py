"""Planning a run: transformer costs, the layout planner and published runs: the modules of chapter 13, planning a training run, of part 2 (see :mod:`utils.parallel`)."""
