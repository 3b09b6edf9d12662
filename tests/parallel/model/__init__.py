"""Tests of utils.parallel.model, one file per module."""
