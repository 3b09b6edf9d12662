"""Tests of utils.parallel.data, one file per module."""
