"""The interactive web lab over a live local cluster (``chronoq lab``)."""
