"""Checkers for chapter quantization (filled in by that chapter)."""
