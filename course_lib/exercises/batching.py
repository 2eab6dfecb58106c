"""Checkers for chapter batching (filled in by that chapter)."""
