"""Tests of utils.serving.quantisation, one file per module."""
