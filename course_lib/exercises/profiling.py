"""Checkers for chapter profiling (filled in by that chapter)."""
