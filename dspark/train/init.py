"""Start a block drafter from the target's own last layers instead of random weights.

A DSpark/DFlash drafter whose layers have the target's shapes can begin as a copy of
the target's last N decoder layers: drafter layer j <- target layer L - N + j. The
context projection `fc` starts as a selection of one tap, the output of layer
L - N - 1 (the input of the first copied layer), and `hidden_norm` as that layer's
input norm, so the injected keys/values of drafter layer 0 are at the start exactly
the keys/values target layer L - N computes from its input. The drafter's queries still
start from the block's token embeddings, not from the target's residual stream, so
this is a start near the target's own next-token computation, not a copy of it.

Target layers store q/k/v and gate/up fused (`qkv_proj`, `gate_up_proj`); the drafter
keeps the Hugging Face split. A Qwen3-style drafter's q/k norms (absent in a Llama
target) start at one.
"""

from __future__ import annotations

import torch

from dspark.drafters.dspark import DSparkDrafter
from dspark.errors import UserError
from dspark.runtime.model import Transformer
from dspark.runtime.weight_formats import dense_weight

INIT_CHOICES = ("random", "target")


def _dense(linear) -> torch.Tensor:
    try:
        return dense_weight(linear).detach().float()
    except (AttributeError, ValueError):
        raise UserError("--init target needs the target's dense weights (load it in fp32 or bf16)") from None


@torch.no_grad()
def init_from_target(drafter, target: Transformer) -> list[str]:
    """Copy the target's last layers into a block drafter; returns what was set, one
    line each (for the training log). Raises UserError where the shapes do not fit."""
    if not isinstance(drafter, DSparkDrafter):
        raise UserError(f"--init target applies to dspark and dflash, not {drafter.method}")
    tcfg, dcfg = target.cfg, drafter.layer_config
    for name in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim"):
        if getattr(tcfg, name) != getattr(dcfg, name):
            raise UserError(f"--init target needs the drafter's {name} equal to the target's "
                            f"({getattr(dcfg, name)} != {getattr(tcfg, name)})")
    n, total = len(drafter.layers), len(target.layers)
    first = total - n
    taps = list(drafter.target_layer_ids)
    source_tap = first - 1  # the output of this target layer is the first copied layer's input
    if source_tap not in taps:
        raise UserError(f"--init target with {n} drafter layers needs target layer {source_tap} among "
                        f"--target-layer-ids (it feeds layer {first}); got {taps}")
    done = []
    for j, layer in enumerate(drafter.layers):
        src = target.layers[first + j]
        q, k, v = _dense(src.qkv_proj).split([tcfg.q_size, tcfg.kv_size, tcfg.kv_size], dim=0)
        att = layer.self_attn
        for dst, w in ((att.q_proj, q), (att.k_proj, k), (att.v_proj, v)):
            dst.weight.copy_(w)
        if tcfg.qkv_bias and att.q_proj.bias is not None:
            bq, bk, bv = src.qkv_proj.bias.detach().float().split([tcfg.q_size, tcfg.kv_size, tcfg.kv_size])
            att.q_proj.bias.copy_(bq), att.k_proj.bias.copy_(bk), att.v_proj.bias.copy_(bv)
        att.o_proj.weight.copy_(_dense(src.o_proj))
        gate, up = _dense(src.gate_up_proj).chunk(2, dim=0)
        layer.mlp.gate_proj.weight.copy_(gate)
        layer.mlp.up_proj.weight.copy_(up)
        layer.mlp.down_proj.weight.copy_(_dense(src.down_proj))
        layer.input_layernorm.weight.copy_(src.input_layernorm.weight.float())
        layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight.float())
        if tcfg.qk_norm and hasattr(att, "q_norm"):
            att.q_norm.weight.copy_(src.q_norm.weight.float())
            att.k_norm.weight.copy_(src.k_norm.weight.float())
        done.append(f"drafter layer {j} <- target layer {first + j}")
    if tcfg.qkv_bias and drafter.layers[0].self_attn.q_proj.bias is None:
        done.append("the target's q/k/v biases are not copied: the drafter's layers have none (the Qwen3-style "
                    "layout other engines read), so it starts further from the target than on a bias-free one")
    if not tcfg.qk_norm and hasattr(drafter.layers[0].self_attn, "q_norm"):
        done.append("the drafter's q/k norms (which the target has not) start at 1")
    h = tcfg.hidden_size
    slot = taps.index(source_tap)
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, slot * h:(slot + 1) * h] = torch.eye(h)
    drafter.hidden_norm.weight.copy_(target.layers[first].input_layernorm.weight.float())
    done.append(f"fc <- tap {slot} (target layer {source_tap}); hidden_norm <- layer {first}'s input norm")
    return done


def continue_from(config, target, sizes: dict,
                  token_counts: torch.Tensor | None = None) -> tuple[torch.nn.Module, list[str]]:
    """The trained drafter in `config.init` (a directory), in fp32 and training mode, to
    continue from: its sizes and draft vocabulary are kept, so any size flag given must
    agree with it; except a larger --num-layers for dspark/dflash, which grows it
    (`grow_layers`), other --target-layer-ids, which move its taps (`retap`), and a
    larger --draft-vocab-size, which adds the next most frequent response tokens
    (`grow_vocab`, by `token_counts`); with what was changed, one line each (for the
    training log)."""
    from dspark.drafters import load_drafter
    from dspark.drafters.checkpoint import DrafterCheckpointError

    try:
        drafter = load_drafter(config.init, target, dtype=torch.float32)
    except DrafterCheckpointError as e:
        raise UserError(f"--init {config.init}: {e}") from None
    if drafter.method != config.method:
        raise UserError(f"--init {config.init} is a {drafter.method} drafter, not {config.method}")
    have = vars(drafter.config)
    if config.draft_vocab_size:
        sizes = {**sizes, "draft_vocab_size": config.draft_vocab_size}
    layers = sizes.pop("num_hidden_layers", have["num_hidden_layers"])
    taps = sizes.pop("target_layer_ids", None)
    vocab = sizes.pop("draft_vocab_size", None)
    old_vocab = have.get("draft_vocab_size") or have["vocab_size"]
    if vocab is not None and vocab != old_vocab:
        if vocab < old_vocab or have.get("draft_vocab_size") is None:
            sizes["draft_vocab_size"] = vocab  # reported below: a draft vocabulary grows, never shrinks
        elif token_counts is None:
            raise UserError("--draft-vocab-size larger than the drafter's needs the training responses' "
                            "token counts")
    differ = [f"{k} {v!r} (the drafter has {have.get(k)!r})" for k, v in sizes.items()
              if k in have and have.get(k) != v]
    if layers < have["num_hidden_layers"]:
        differ.append(f"num_hidden_layers {layers} (the drafter has {have['num_hidden_layers']}; "
                      "a drafter can grow, not shrink)")
    if differ:
        raise UserError(f"--init {config.init}: the drafter's sizes are kept, but the flags ask for "
                        + "; ".join(differ))
    if layers > len(drafter.layers):
        drafter = grow_layers(drafter, target, layers)
    lines = []
    if vocab is not None and vocab > old_vocab and have.get("draft_vocab_size") is not None:
        drafter, lines = grow_vocab(drafter, target, vocab, token_counts)
    if taps is not None and list(taps) != list(drafter.target_layer_ids):
        drafter, moved = retap(drafter, target, list(taps))
        lines += moved
    drafter.requires_grad_(True)  # its own weights; the target's embeddings and head are not among them
    return drafter.train(), lines


@torch.no_grad()
def grow_layers(drafter, target, num_layers: int) -> torch.nn.Module:
    """A DSpark/DFlash drafter with `num_layers` decoder layers: its own first, then
    copies of its last layer whose output projections (attention o_proj, MLP
    down_proj) start at zero. Each new layer then adds nothing to the residual
    stream, so the grown drafter drafts exactly what the trained one did, and
    training decides what the new capacity adds."""
    import dataclasses

    if not isinstance(drafter, DSparkDrafter):
        raise UserError(f"only dspark and dflash drafters grow layers, not {drafter.method}")
    old = len(drafter.layers)
    state = drafter.state_dict()
    last = drafter.layers[old - 1].state_dict()
    for j in range(old, num_layers):
        for name, w in last.items():
            state[f"layers.{j}.{name}"] = w.clone()
        state[f"layers.{j}.self_attn.o_proj.weight"].zero_()
        state[f"layers.{j}.mlp.down_proj.weight"].zero_()
    return _rebuilt(drafter, target, dataclasses.replace(drafter.config, num_hidden_layers=num_layers), state)


@torch.no_grad()
def grow_vocab(drafter, target, size: int, token_counts: torch.Tensor) -> tuple[torch.nn.Module, list[str]]:
    """The drafter with a draft vocabulary of `size` tokens: its own tokens, then the
    most frequent others by `token_counts` ([target vocab] response-token counts). A
    kept token keeps its rows (the LM head's and the Markov head's output row); a new
    token's LM-head row starts as the target's own LM-head row of it (as a fresh
    reduced head starts) and its Markov output row at zero (no bias until trained).
    Returns the drafter and one line for the training log."""
    import dataclasses

    from .vocab import most_frequent

    if not getattr(drafter.config, "reduced_vocab", False):
        raise UserError(f"a {drafter.method} drafter without a reduced draft vocabulary cannot grow one")
    if size >= drafter.config.vocab_size:
        raise UserError(f"--draft-vocab-size {size}: a draft vocabulary as large as the target's "
                        f"({drafter.config.vocab_size}) is the target's shared head; train one with --init target")
    old_ids = drafter.draft_token_ids().cpu()
    counts = token_counts.clone().to(torch.long)
    counts[old_ids] = torch.iinfo(torch.long).max  # the drafter's own tokens come first
    ids = torch.tensor(most_frequent(counts, size), dtype=torch.long)
    config = dataclasses.replace(drafter.config, draft_vocab_size=size)
    state = drafter.state_dict()
    old_index = drafter.to_draft_ids(ids).cpu()  # -1: a new token
    kept = old_index >= 0
    target_head = _dense(getattr(target, "model", target).lm_head)
    head = target_head[ids.to(target_head.device)].cpu()
    head[kept] = state["lm_head.weight"][old_index[kept]].float()
    state["lm_head.weight"] = head
    if "markov_head.markov_w2.weight" in state:
        w2 = state["markov_head.markov_w2.weight"]
        grown = w2.new_zeros(size, w2.shape[1])
        grown[kept] = w2[old_index[kept]]
        state["markov_head.markov_w2.weight"] = grown
    state["d2t"] = ids - torch.arange(size)
    t2d = torch.zeros(drafter.config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d
    out = _rebuilt(drafter, target, config, state)
    new = int((~kept).sum())
    return out, [f"draft vocabulary {old_ids.numel()} -> {size}: {new} tokens added, their LM-head rows "
                 "from the target's LM head, their Markov rows at zero"]


def _rebuilt(drafter, target, config, state: dict) -> torch.nn.Module:
    """A drafter of `config` (fp32, on the CPU) holding `state`, with `drafter`'s STS
    temperatures (they live outside the state dict)."""
    from dspark.drafters.factory import build_drafter
    from dspark.drafters.target_parts import TargetParts

    with torch.device("cpu"):
        out = build_drafter(config, TargetParts.of(target)).float()
    out.load_state_dict(state, strict=True)
    if getattr(drafter, "confidence_head", None) is not None:
        out.confidence_head.set_temperatures(list(drafter.confidence_head.temperatures))
    return out


@torch.no_grad()
def retap(drafter, target, taps: list[int]) -> tuple[torch.nn.Module, list[str]]:
    """The drafter reading other target layers: its context projection `fc` takes one
    block of columns per tap, and each new tap's block starts as the block of the old
    tap nearest in depth (a tie goes to the deeper), divided among the new taps that
    share it, so that the projection starts as close to the trained one as the residual
    stream allows. Everything else is kept. Training then adapts it to the new taps.
    Returns the drafter and one line per tap for the training log.

    One use: a drafter that taps the target's last layer cannot be served by engines
    that read a tap as the next layer's input (llama.cpp); moved one layer down, it can."""
    import dataclasses

    old = list(drafter.target_layer_ids)
    if getattr(drafter, "fc", None) is None or drafter.fc.weight.shape[1] % len(old):
        raise UserError(f"--target-layer-ids cannot move the taps of a {drafter.method} drafter")
    try:
        config = dataclasses.replace(drafter.config, target_layer_ids=list(taps))
    except ValueError as e:
        raise UserError(f"--target-layer-ids {taps}: {e}") from None
    problems = config.check_target(target.cfg)
    if problems:
        raise UserError(f"--target-layer-ids {taps}: " + "; ".join(problems))
    width = drafter.fc.weight.shape[1] // len(old)
    source = [min(range(len(old)), key=lambda i: (abs(old[i] - t), -old[i])) for t in taps]
    share = {i: source.count(i) for i in set(source)}
    blocks = [drafter.fc.weight[:, i * width:(i + 1) * width] / share[i] for i in source]
    state = drafter.state_dict()
    state["fc.weight"] = torch.cat(blocks, dim=1)
    moved = _rebuilt(drafter, target, config, state)
    lines = [f"tap {j}: target layer {t} <- the columns of layer {old[i]}"
             + (f" (shared by {share[i]})" if share[i] > 1 else "")
             for j, (t, i) in enumerate(zip(taps, source))]
    return moved, lines
