"""Speculative decoding, chapter 4 and lab 2 of part 5: the acceptance rule, expected tokens and speed-up, the trained tiny targets and drafts, and the chi-square test (see :mod:`utils.serving`)."""
