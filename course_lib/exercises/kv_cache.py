"""Checkers for chapter kv_cache (filled in by that chapter)."""
