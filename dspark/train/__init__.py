"""Drafter training (DSpark, DFlash, Eagle3, MTP-1 under one recipe) and STS calibration.

`Trainer(TrainConfig(...), target).run()` trains a drafter from regenerated-response
files (`dspark.data`) with the frozen target as teacher and writes a drafter
checkpoint; `fit_sts` fits the confidence head's per-position temperatures on
held-out data. The CLI front ends are `dspark train` and `dspark calibrate`.
"""

from .config import TrainConfig
from .placement import DistInfo
from .trainer import Trainer, TrainResult

__all__ = ["DistInfo", "TrainConfig", "TrainResult", "Trainer"]
