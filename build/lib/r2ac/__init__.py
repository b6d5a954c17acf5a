"""r2ac: exact real-time recurrent learning (RTRL) and the R2AC actor-critic."""

__version__ = "0.1.0"
