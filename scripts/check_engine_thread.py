"""Decode speed of one LLMEngine request on the main thread and on a second thread
(torch's CPU pool belongs to the thread that first used it). Usage: python scripts/check_engine_thread.py"""
import time, torch, threading, sys
from dspark.runtime.target import Target
from dspark.engine.engine import LLMEngine, EngineConfig
from dspark.sampling import SamplingParams
t = Target.load("default", dtype="bf16")
eng = LLMEngine(t, None, EngineConfig(max_num_seqs=32, max_model_len=2048))
ids = t.tokenizer.chat_prompt("Write a persuasive email to convince your friend to volunteer.")
def run():
    with torch.inference_mode():
        for k in range(3):
            seq = eng.add_request(ids, SamplingParams(max_tokens=64, ignore_eos=True))
            t0 = time.perf_counter(); n = 0
            while eng.has_unfinished():
                eng.step()
            dt = time.perf_counter() - t0
            print(threading.current_thread().name, "ms/token", 1000 * dt / 64, flush=True)
run()
th = threading.Thread(target=run, name="worker"); th.start(); th.join()
