"""Tests of utils.serving.prefix, one file per module."""
