"""Tests of utils.parallel.comm, one file per module."""
