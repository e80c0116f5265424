"""Prediction over many labels in chunks, and the metrics computed from it."""
