"""Tests of utils.parallel.planning, one file per module."""
