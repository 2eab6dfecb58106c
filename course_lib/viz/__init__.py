"""Plots (matplotlib) and widgets (ipywidgets) used by the notebooks, one module per chapter.

Widget callbacks are plain functions (tested in tests/) wrapped by thin ipywidgets glue.
Import the submodule you need, e.g. `from course_lib.viz import tokens`.
"""
