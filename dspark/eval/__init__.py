"""Offline measurement of drafters: acceptance through the real engine
(`acceptance`) and the reliability diagram of confidence estimates (`calibration`;
the metrics themselves are `dspark.calibration`, a leaf)."""
