"""Predicted step time per point, calibrated on the user's own runs (docs/step-time-prediction.md)."""
