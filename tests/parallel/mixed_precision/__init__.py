"""Tests of utils.parallel.mixed_precision, one file per module."""
