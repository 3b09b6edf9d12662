"""Tests of utils.serving.many_gpus, one file per module."""
