"""Our engine beside llama.cpp's and vLLM's on the same target and prompts (`dspark bench
peers --engine llama.cpp|vllm`): drafters exported to each, acceptance and speed read
from their servers against ours (`common`: the export, the target and our acceptance)."""
