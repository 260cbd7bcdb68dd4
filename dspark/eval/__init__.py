"""Offline measurement of drafters: acceptance through the real engine
(`acceptance`) and calibration metrics of confidence estimates (`calibration`)."""
