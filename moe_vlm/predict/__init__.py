"""Predicted step time per point, calibrated on the user's own runs (docs/step-time-prediction.md)."""

from moe_vlm.predict.calibration import Calibration, calibration_path
from moe_vlm.predict.model import Prediction, predict

__all__ = ["Calibration", "Prediction", "calibration_path", "predict"]
