"""Tests of utils.parallel.frontier, one file per module."""
