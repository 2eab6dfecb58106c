"""Checkers for chapter prefill_decode (filled in by that chapter)."""
