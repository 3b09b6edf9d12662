"""Tests of utils.serving.speculation, one file per module."""
