"""Data parallelism: DDP, ZeRO and FSDP, and the labs' training harness: the modules of chapters 03 DP and DDP and 04 ZeRO and FSDP of part 2 (see :mod:`utils.parallel`)."""
