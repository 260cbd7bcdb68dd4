from pathlib import Path
from dspark.runtime.loader import _measure_precisions
from dspark.runtime.config import ModelConfig
from dspark.runtime.default_model import default_model_dir
cfg = ModelConfig.from_dir(Path(default_model_dir()))
for i in range(4):
    print(_measure_precisions(cfg, 7))
