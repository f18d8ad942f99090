"""Knobs as the engines see them: which engine honours which knob (support.py), THE knob -> Bridge
field table (bridge_fields.py, with telemetry_fields.py's rows and keep.py's KEEP).

Declarations only, below the rules and the engines that read them (docs/layout.md)."""
