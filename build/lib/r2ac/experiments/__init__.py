"""Experiment grids and studies behind `r2ac experiment` (the paper's tables, curves and cost study)."""
