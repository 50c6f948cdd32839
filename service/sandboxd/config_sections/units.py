"""Byte units of the sections' defaults and bounds."""

KiB, MiB, GiB = 1024, 1024**2, 1024**3
