"""What `dspark serve` is configured with, and the engine built from it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from dspark.engine.config import EngineConfig, SpeculativeConfig, resolve_speculative
from dspark.errors import UserError
from dspark.runtime.default_model import DEFAULT_MODEL_NAME

from .tenants import Tenants, keys_from_args

log = logging.getLogger("dspark.serve")

@dataclass
class ServeConfig:
    # target
    model: str = "default"
    dtype: str = "auto"
    device: str | None = None
    threads: int | None = None
    #: a config, None for no speculation, or "default" (dspark.engine.config.DEFAULT_SPECULATIVE)
    speculative: SpeculativeConfig | str | None = "default"
    engine: EngineConfig = field(default_factory=EngineConfig)
    # HTTP
    host: str = "127.0.0.1"
    port: int = 8000
    #: one key or several (each its own tenant); None: no key unless `api_keys_file` gives some
    api_key: str | list[str] | None = None
    #: a file of `KEY TENANT` lines (dspark.serve.tenants)
    api_keys_file: str | None = None
    #: True: /metrics answers without a key even when keys are configured
    metrics_public: bool = False
    #: > 0: streamed tokens go out in groups of this many (the last group shorter), so that
    #: a chunk's size no longer tells how many of its tokens were drafted; 0: one chunk a step
    stream_chunk_tokens: int = 0
    #: the keys' tenants and the requests' namespaces, from `api_key` and `api_keys_file`
    tenants: Tenants = field(init=False, repr=False)
    #: names clients may use in "model"; the first is the one /v1/models reports
    served_model_names: list[str] = field(default_factory=list)
    #: seconds between periodic log lines; 0 turns them off
    log_interval: float = 10.0
    #: seconds in-flight requests get to finish after SIGINT/SIGTERM
    shutdown_timeout: float = 30.0
    #: seconds a request that arrives while the server starts waits for the engine before
    #: its 503 (a client started beside the server need not retry); 0 answers 503 at once
    ready_wait: float = 60.0
    #: request bodies over this many bytes are refused with 413
    max_request_bytes: int = 4 * 2**20

    def __post_init__(self) -> None:
        if isinstance(self.speculative, str) and self.speculative != "default":
            raise UserError(f"speculative must be a SpeculativeConfig, None or 'default', got {self.speculative!r}")
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in 0..65535, got {self.port}")
        if self.log_interval < 0:
            raise UserError(f"--log-interval must be >= 0 seconds, got {self.log_interval}")
        if self.ready_wait < 0:
            raise UserError(f"--ready-wait must be >= 0 seconds, got {self.ready_wait}")
        if self.shutdown_timeout < 0:
            raise UserError(f"--shutdown-timeout must be >= 0 seconds, got {self.shutdown_timeout}")
        if self.max_request_bytes < 1024:
            raise UserError(f"--max-request-bytes must be >= 1024, got {self.max_request_bytes}")
        if self.stream_chunk_tokens < 0:
            raise UserError(f"--stream-chunk-tokens must be >= 0 (0: one chunk per engine step), "
                            f"got {self.stream_chunk_tokens}")
        keys = [self.api_key] if isinstance(self.api_key, str) else list(self.api_key or [])
        self.tenants = Tenants(keys_from_args(keys, self.api_keys_file))
        if any(not n for n in self.served_model_names):
            raise UserError("--served-model-name must not be empty")


def default_served_name(model: str | None) -> str:
    """The name /v1/models reports for `--model` (or a target's name)."""
    if model in (None, "", "default"):
        return DEFAULT_MODEL_NAME
    return Path(model).name or str(model)


def build_engine(config: ServeConfig, on_phase=lambda phase: None):
    """The engine `config` describes; `on_phase("loading")` before the model loads,
    `on_phase("profiling")` before the drafter loads and the step times are measured."""
    from dspark.engine.engine import LLMEngine
    from dspark.runtime.target import Target

    on_phase("loading")
    target = Target.load(config.model, dtype=config.dtype, device=config.device,
                         max_len=config.engine.max_model_len, threads=config.threads)
    spec = resolve_speculative(config.speculative, target)
    log.info("speculative decoding: %s", "off" if spec is None else
             f"{spec.method} (policy {spec.policy}, drafter {spec.model or 'shipped'})")
    on_phase("profiling")
    return LLMEngine(target, spec, config.engine)
