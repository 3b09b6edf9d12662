"""Tests of utils.serving.costs, one file per module."""
