"""Checkers for notebook NN (placeholder: being written)."""
from __future__ import annotations
