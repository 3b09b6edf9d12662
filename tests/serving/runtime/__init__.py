"""Tests of utils.serving.runtime, one file per module."""
