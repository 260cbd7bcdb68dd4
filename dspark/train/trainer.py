"""The training loop: one recipe for DSpark, DFlash, Eagle3 and MTP-1.

Per optimizer step: take the step's global batch of sequences (this rank's share),
sample anchors, let the frozen target teach (hidden states + distributions at the
drafted positions), run the method's teacher-forced forward (`objectives`), and
minimise the weighted distillation loss (`losses`) with AdamW, linear warmup then
cosine decay, gradient clipping, and bf16 autocast on CUDA (see `autocast_dtype`).

Data parallelism: launched by `torchrun`, every process holds the drafter and the
target, computes its share of the global batch, and DistributedDataParallel averages
gradients (gloo on CPU, nccl on CUDA). The loss is normalised by the position weight
summed over all processes, so one process and N processes with the same global batch
take the same step.

`DIR` receives `train_log.jsonl`, checkpoints `checkpoints/step-N/` (a drafter
checkpoint plus `trainer_state.safetensors/json` with fp32 master weights and AdamW
moments, see `checkpoints`; `--resume` continues from the newest) and the final
drafter in `DIR` itself.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch import nn

from dspark.drafters import create_drafter, save_drafter
from dspark.drafters.factory import build_drafter
from dspark.errors import UserError
from dspark.runtime.target import Target

from .checkpoints import read_checkpoint, write_checkpoint
from .config import TrainConfig
from .data import BatchPlan, end_of_turn_id, load_sequences, visit_anchors, visits_per_sequence
from .heldout import heldout_acceptance, round_start_weights
from .lookup_misses import lookup_miss_weights, lookup_misses
from .init import continue_from
from .losses import (expected_acceptance_length, greedy_match, per_position_means, position_terms, position_weights,
                     weighted_sums)
from .objectives import AnchorBatch, draft_forward
from .placement import DistInfo, autocast_dtype
from .teacher import CachedTeacher, OnTheFlyTeacher, TopKTargets
from .vocab import most_frequent, response_token_counts


def _log_line(rec: dict, total: int) -> str:
    rates = [v for k, v in rec.items() if k.startswith("accept_rate@")]
    greedy = [v for k, v in rec.items() if k.startswith("greedy@")]
    terms = " ".join(f"{k} {rec[k]:.4f}" for k in ("loss", "ce", "l1", "bce") if k in rec)
    return (f"step {rec['step']}/{total} {terms} accept@1..{len(rates)} "
            f"{' '.join(f'{r:.2f}' for r in rates)} greedy@1..3 {' '.join(f'{r:.2f}' for r in greedy[:3])} "
            f"tau {rec['expected_tau']:.3f} ({rec['elapsed_s']:.0f} s)")


class _DraftModule(nn.Module):
    """The drafter with its teacher-forced forward as `forward`, so DDP can wrap it."""

    def __init__(self, drafter: nn.Module) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: AnchorBatch, hidden: torch.Tensor):
        return draft_forward(self.drafter, batch, hidden)


@dataclass
class TrainResult:
    out: Path
    steps: int
    wall_s: float
    last_log: dict = field(default_factory=dict)
    num_sequences: int = 0
    num_tokens: int = 0


def num_positions(drafter, config: TrainConfig) -> int:
    """γ: drafted positions trained per anchor."""
    if drafter.method == "mtp":
        return 1
    if drafter.method == "eagle3":
        return min(config.ttt_steps, drafter.max_draft_tokens)
    return drafter.max_draft_tokens


class Trainer:
    def __init__(self, config: TrainConfig, target: Target, dist: DistInfo | None = None,
                 model_name: str = "default") -> None:
        # the recipe's target-dependent choices (taps, draft vocabulary) made here, so
        # the saved config says what was trained
        config = config.for_target(target.model.cfg.num_layers, target.model.cfg.vocab_size)
        self.config = config
        self.target = target
        self.dist = dist or DistInfo()
        self.model_name = model_name
        self.out = Path(config.out)
        self.device = str(target.device)
        target.model.requires_grad_(False)
        eos = end_of_turn_id(target.tokenizer)
        self.seqs = load_sequences(config.data, eos, config.max_seq_len)
        self.eval_seqs = load_sequences(config.eval_data, eos, config.max_seq_len) if config.eval_data else []
        self.plan = BatchPlan(visits_per_sequence(self.seqs, config.blocks_per_seq), config.batch_size, config.seed,
                              self.dist.rank, self.dist.world_size)
        self.total_steps = config.max_steps or max(1, math.ceil(config.epochs * self.plan.steps_per_epoch))
        sizes = config.drafter_sizes()
        vocab = None
        if config.draft_vocab_size and config.init in ("random", "target"):
            counts = response_token_counts(self.seqs, target.model.cfg.vocab_size)
            vocab = most_frequent(counts, config.draft_vocab_size, always=[] if eos is None else [eos])
            sizes["draft_vocab_size"] = config.draft_vocab_size
        init_lines = []
        if config.init not in ("random", "target"):
            counts = (response_token_counts(self.seqs, target.model.cfg.vocab_size)
                      if config.draft_vocab_size else None)
            self.drafter, init_lines = continue_from(config, target, sizes, counts)
        else:
            try:
                self.drafter = create_drafter(config.method, target, seed=config.seed, dtype=torch.float32,
                                              draft_token_ids=vocab, **sizes).train()
            except ValueError as e:
                raise UserError(str(e)) from None
        if config.init == "target" and not config.resume:
            from .init import init_from_target

            init_lines = init_from_target(self.drafter, target.model)
        for line in init_lines if self.dist.is_main else []:
            print(f"[train] init: {line}", file=sys.stderr)
        self.gamma = num_positions(self.drafter, config)
        self.autocast = autocast_dtype(config.precision, self.device)
        decay = [p for p in self.drafter.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.drafter.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.lr, betas=(0.9, 0.95), eps=1e-8)
        self.warmup = config.warmup_steps if config.warmup_steps is not None else max(1, round(0.04 * self.total_steps))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        self.step = 0
        self.best_eval: float | None = None
        self.evals_since_best = 0
        self.train_s = 0.0  # training wall time of earlier runs (resume)
        if config.resume:
            self._resume()
        self.teacher = self._make_teacher(self.seqs)
        # per sequence, the positions where prompt lookup would not propose the next token
        self.lookup_misses = None
        if config.lookup_miss_weight:
            self.lookup_misses = [lookup_misses(s.tokens) for s in self.seqs]
            share = (sum(int(m[s.prompt_len:-1].sum()) for m, s in zip(self.lookup_misses, self.seqs))
                     / max(1, sum(len(s.tokens) - s.prompt_len - 1 for s in self.seqs)))
            if self.dist.is_main:
                print(f"[train] lookup misses: {share:.1%} of the response anchors weigh "
                      f"{1 + config.lookup_miss_weight:g}", file=sys.stderr)
        self.eval_teacher = self._make_teacher(self.eval_seqs) if self.eval_seqs else None
        module = _DraftModule(self.drafter)
        if self.dist.world_size > 1:
            ids = [int(self.device.split(":")[1])] if self.device.startswith("cuda") else None
            module = nn.parallel.DistributedDataParallel(module, device_ids=ids)
        self.module = module

    # --- schedule ------------------------------------------------------------------
    def lr_factor(self, step: int) -> float:
        """Linear warmup to 1, then cosine decay to `min_lr_ratio` at the last step."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        span = max(1, self.total_steps - self.warmup)
        t = min(1.0, (step - self.warmup) / span)
        lo = self.config.min_lr_ratio
        return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * t))

    # --- pieces ----------------------------------------------------------------------
    def _make_teacher(self, seqs):
        cfg = self.config
        layers = list(self.drafter.target_layer_ids)
        if cfg.feature_cache is None:
            return OnTheFlyTeacher(self.target.model, layers, seqs, topk=cfg.teacher_topk)
        # One process builds the cache, the others wait and read it.
        if self.dist.is_main:
            teacher = CachedTeacher(self.target.model, layers, seqs, cfg.feature_cache, self.model_name,
                                    progress=cfg.progress, topk=cfg.teacher_topk)
        self.dist.barrier()
        if not self.dist.is_main:
            teacher = CachedTeacher(self.target.model, layers, seqs, cfg.feature_cache, self.model_name,
                                    build=False, topk=cfg.teacher_topk)
        return teacher

    def _anchor_batch(self, step: int) -> tuple[list[int], AnchorBatch]:
        epoch, local = self.plan.local_batch(step)
        seqs = [self.seqs[i] for i, _ in local]
        anchors = [visit_anchors(s, self.config.blocks_per_seq, self.config.seed, epoch, i, v)
                   for s, (i, v) in zip(seqs, local)]
        return [i for i, _ in local], AnchorBatch.build([s.tokens for s in seqs], anchors, self.gamma, self.device)

    def _targets(self, batch: AnchorBatch, targets: TopKTargets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(top-k ids as draft indices, their probabilities, labels as draft indices)."""
        to_draft = self.drafter.to_draft_ids
        return to_draft(targets.ids), targets.probs, to_draft(batch.labels())

    def _forward(self, batch: AnchorBatch, hidden: torch.Tensor):
        with torch.autocast(self.device.split(":")[0], dtype=self.autocast or torch.float32,
                            enabled=self.autocast is not None):
            return self.module(batch, hidden)

    def train_step(self, step: int) -> dict[str, torch.Tensor]:
        """One optimizer step; returns detached sums for logging."""
        local, batch = self._anchor_batch(step)
        hidden, targets = self.teacher.teach(local, batch.target_rows())
        p_ids, p_probs, labels = self._targets(batch, targets)
        k = batch.positions()
        weights = position_weights(k, self.drafter.method, self.config.position_decay)
        drafted = self._forward(batch, hidden)
        matched = greedy_match(drafted.logits.detach(), p_ids[:, 0])
        if self.config.round_start_weight:
            weights = weights * round_start_weights(batch, matched, self.config.round_start_weight)
        if self.lookup_misses is not None:
            misses = [self.lookup_misses[i] for i in local]
            weights = weights * lookup_miss_weights(batch, misses, self.config.lookup_miss_weight).to(weights)
        terms = position_terms(drafted.logits, p_ids, p_probs, labels, drafted.conf_logits)
        sums = weighted_sums(terms, weights)
        denom = self.dist.all_reduce(weights.sum().detach().double()).float()
        # DDP averages gradients over processes; scaling by the world size makes the
        # result the gradient of (global weighted sum) / (global weight).
        loss = sums["loss"] * self.dist.world_size / denom.clamp(min=1e-12)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        acc_sum, acc_n = per_position_means(terms.accept, k, self.gamma)
        greedy_sum, _ = per_position_means(matched.double(), k, self.gamma)
        out = {name: v.detach().double() for name, v in sums.items()}
        out["loss"] = out["loss"].detach()
        out.update(weight=weights.sum().double(), accept_sum=acc_sum, accept_n=acc_n, greedy_sum=greedy_sum,
                   tail_sum=targets.tail.sum().double(), grad_norm=grad_norm.detach().double())
        return out

    def evaluate(self) -> dict:
        """Held-out greedy acceptance, teacher-forced (`heldout.heldout_acceptance`)."""
        return heldout_acceptance(self, self.eval_teacher, self.eval_seqs)

    def run(self) -> TrainResult:
        from tqdm import tqdm

        cfg = self.config
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        log_path = self.out / "train_log.jsonl"
        if self.dist.is_main and not cfg.resume:
            log_path.unlink(missing_ok=True)  # a fresh run starts a fresh log; --resume appends
        bar = tqdm(total=self.total_steps, initial=self.step, desc=f"train {cfg.method}", unit="step",
                   disable=not (cfg.progress and self.dist.is_main), dynamic_ncols=True)
        t0 = time.perf_counter()
        last_save = t0
        saved_step = -1
        acc: dict[str, torch.Tensor] = {}
        last: dict = {}
        stopped = ""
        while self.step < self.total_steps:
            stats = self.train_step(self.step)
            self.step += 1
            for name, v in stats.items():
                acc[name] = acc[name] + v if name in acc else v.clone()
            if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                last = self._log(acc, log_path, self.train_s + time.perf_counter() - t0)
                acc = {}
                bar.set_postfix_str(f"loss {last['loss']:.3f} greedy@1 {last.get('greedy@1', 0):.2f}", refresh=False)
                if bar.disable and self.dist.is_main:  # no bar (e.g. a log file): one line per log
                    print(_log_line(last, self.total_steps), file=sys.stderr, flush=True)
            bar.update(1)
            now = time.perf_counter()
            due = self.step % cfg.save_every == 0 or (cfg.save_every_min and now - last_save >= 60 * cfg.save_every_min)
            if due and self.step < self.total_steps:
                if self._eval_and_log(log_path, self.train_s + now - t0):
                    stopped = "early stop"
                self.save_checkpoint(self.train_s + time.perf_counter() - t0)
                last_save, saved_step = time.perf_counter(), self.step
                if stopped:
                    break
            if self._out_of_time(t0):
                stopped = "time limit"
                break
        bar.close()
        if acc:
            last = self._log(acc, log_path, self.train_s + time.perf_counter() - t0)
        if saved_step != self.step:  # stopped right after a checkpoint: it is already evaluated and saved
            self._eval_and_log(log_path, self.train_s + time.perf_counter() - t0)
            self.save_checkpoint(self.train_s + time.perf_counter() - t0)
        if self.dist.is_main:
            self.save_drafter(self.out)
            if stopped:
                print(f"[train] stopped at step {self.step} ({stopped})", file=sys.stderr, flush=True)
        self.dist.barrier()
        return TrainResult(self.out, self.step, time.perf_counter() - t0, last, len(self.seqs),
                           sum(len(s.tokens) for s in self.seqs))

    def _eval_and_log(self, path: Path, elapsed: float) -> bool:
        """Held-out evaluation (when --eval-data is given), appended to the log; True when
        early stopping says to stop (no better held-out τ for --early-stop-evals evals)."""
        if self.eval_teacher is None:
            return False
        rec = {"step": self.step, "elapsed_s": round(elapsed, 1), **self.evaluate()}
        if self.dist.is_main:
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"[eval] step {self.step}: held-out greedy tau {rec['heldout_tau']:.3f} per anchor, "
                  f"{rec['heldout_renewal_tau']:.3f} as decoding meets them, accept@1..3 "
                  + " ".join(f"{rec.get(f'heldout_accept@{k}', float('nan')):.3f}" for k in (1, 2, 3)),
                  file=sys.stderr, flush=True)
        score = rec["heldout_tau"]
        if self.best_eval is None or score > self.best_eval + 1e-4:
            self.best_eval, self.evals_since_best = score, 0
        else:
            self.evals_since_best += 1
        patience = self.config.early_stop_evals
        return bool(patience) and self.evals_since_best >= patience

    def _out_of_time(self, t0: float) -> bool:
        """Whether --time-limit-min has passed (decided by rank 0, so all ranks stop together)."""
        if self.config.time_limit_min is None:
            return False
        over = torch.tensor([float(time.perf_counter() - t0 > 60 * self.config.time_limit_min)])
        if self.dist.world_size > 1:
            torch_dist.broadcast(over, src=0)
        return bool(over.item())

    def _log(self, acc: dict[str, torch.Tensor], path: Path, elapsed: float) -> dict:
        names = sorted(acc)
        flat = torch.cat([acc[n].reshape(-1) for n in names])
        flat = self.dist.all_reduce(flat)
        vals, i = {}, 0
        for n in names:
            size = acc[n].numel()
            vals[n] = flat[i : i + size]
            i += size
        w = float(vals["weight"].sum())
        counts = vals["accept_n"].clamp(min=1)
        rates = (vals["accept_sum"] / counts).tolist()
        rates = [r if c > 0 else float("nan") for r, c in zip(rates, vals["accept_n"].tolist())]
        greedy = (vals["greedy_sum"] / counts).tolist()
        rec = {"step": self.step, "lr": self.scheduler.get_last_lr()[0],
               "loss": float(vals["loss"]) / w, "ce": float(vals["ce"]) / w, "l1": float(vals["l1"]) / w}
        if "bce" in vals:
            rec["bce"] = float(vals["bce"]) / w
        rec["grad_norm"] = float(vals["grad_norm"]) / self.dist.world_size / max(1, self.config.log_every)
        rec.update({f"accept_rate@{k + 1}": round(r, 4) for k, r in enumerate(rates)})
        rec.update({f"greedy@{k + 1}": round(r, 4) for k, r in enumerate(greedy)})
        rec["expected_tau"] = expected_acceptance_length(rates)
        rec["teacher_tail"] = round(float(vals["tail_sum"]) / max(float(vals["accept_n"].sum()), 1), 5)
        rec["positions"] = int(vals["accept_n"].sum())
        rec["position1_examples"] = int(vals["accept_n"][0])
        rec["elapsed_s"] = round(elapsed, 1)
        if self.dist.is_main:
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return rec

    # --- checkpoints -----------------------------------------------------------------
    def save_drafter(self, path: Path) -> Path:
        """The drafter in `save_dtype` as a checkpoint directory (the DESIGN format)."""
        dtype = torch.bfloat16 if self.config.save_dtype == "bf16" else torch.float32
        with torch.device("meta"):
            shadow = build_drafter(self.drafter.config, self.drafter.target)
        state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).clone()
                 for k, v in self.drafter.state_dict().items()}
        shadow.load_state_dict(state, assign=True)
        return save_drafter(shadow, path)

    def save_checkpoint(self, elapsed_s: float = 0.0) -> None:
        if not self.dist.is_main:
            return
        write_checkpoint(self.out, self.step, self.drafter, self.optimizer, self.save_drafter,
                         {"total_steps": self.total_steps, "train_s": elapsed_s, "best_eval": self.best_eval,
                          "evals_since_best": self.evals_since_best, "config": self.config.to_dict()})

    def _resume(self) -> None:
        meta = read_checkpoint(self.out, self.drafter, self.optimizer)
        self.step = int(meta["step"])
        self.train_s = float(meta.get("train_s", 0.0))
        self.best_eval = meta.get("best_eval")
        self.evals_since_best = int(meta.get("evals_since_best", 0))
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self.lr_factor(self.step)
        self.scheduler.last_epoch = self.step
