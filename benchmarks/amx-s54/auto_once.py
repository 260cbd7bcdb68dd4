import sys
from pathlib import Path
import dspark.runtime.loader as L
from dspark.runtime.config import ModelConfig
from dspark.runtime.default_model import default_model_dir
L.MEASURE_WARMUP = int(sys.argv[1])
cfg = ModelConfig.from_dir(Path(default_model_dir()))
print(sys.argv[1], L._measure_precisions(cfg, 7))
