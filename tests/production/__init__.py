"""Tests of utils.production, one file per module."""
