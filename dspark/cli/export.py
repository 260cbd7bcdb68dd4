"""`dspark export`: write a trained drafter in the checkpoint layout another engine reads."""

from __future__ import annotations

import argparse
import sys

from .common import add_model_args

FORMAT_HELP = """formats:
  deepspec     Qwen3DSparkModel / DFlashDraftModel, the layout of the public DSpark and
               DFlash releases (fields at the top level and under dflash_config, with
               sample_from_anchor, dspark_bonus_anchor, enable_confidence_head,
               draft_vocab_size, and lm_head + d2t for a reduced draft vocabulary).
               Read by llama.cpp's convert_hf_to_gguf.py (then llama-server
               --spec-type draft-dspark / draft-dflash) and by vLLM
               ("method": "dspark" / "dflash"). DSpark and DFlash drafters with
               Qwen3-style layers only (what `dspark train` creates).
  speculators  DSparkSpeculator / DFlashSpeculator / Eagle3Speculator of vLLM's
               speculators library (layer fields under transformer_layer_config, taps
               numbered one higher, embed_tokens + lm_head inside). Read by vLLM, by
               speculators, and by llama.cpp's converter.
  eagle3       LlamaForCausalLMEagle3 (SpecForge / vLLM EAGLE-3: midlayer.*,
               eagle_aux_hidden_state_layer_ids, draft_vocab_size, lm_head + d2t).
               Read by vLLM ("method": "eagle3") and by llama.cpp's converter (then
               llama-server --spec-type draft-eagle3). Eagle3 drafters with a Llama
               layer and exactly 3 taps.

  llama.cpp    what llama.cpp's convert_hf_to_gguf.py reads for each method: DSpark as
               deepspec, Eagle3 as eagle3, and DFlash through its DSpark reader
               (Qwen3DSparkModel without a Markov head), since its DFlash reader drops
               the block convention and a reduced vocabulary's d2t. Convert with
               --target-model-dir and serve with --spec-type draft-dspark /
               draft-dflash / draft-eagle3.

calibration.json (DSpark's STS temperatures) is copied along; `dspark generate/serve
--speculative-config '{"model": OUT}'` loads every format back. See docs/interop.md
for the full commands."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a drafter in the layout llama.cpp, vLLM or speculators reads (deepspec, speculators, eagle3, llama.cpp)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the drafter checkpoint DRAFTER in another engine's layout to OUT.\n\n" + FORMAT_HELP,
    )
    p.add_argument("drafter", metavar="DRAFTER",
                   help="a drafter checkpoint directory (dspark's, or any layout dspark loads)")
    p.add_argument("--to", required=True, dest="fmt", choices=["deepspec", "speculators", "eagle3", "llama.cpp"],
                   help="the layout to write")
    p.add_argument("out", metavar="OUT", help="output directory (created; files in it are overwritten)")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dspark.drafters.export import export_caveats, export_drafter
    from dspark.errors import UserError

    from .common import load_target

    src, out = Path(args.drafter), Path(args.out)
    if not (src / "config.json").is_file():
        raise UserError(f"{src} is not a drafter checkpoint directory (no config.json)")
    if out.resolve() == src.resolve():
        raise UserError("OUT must differ from DRAFTER")
    target = load_target(args)
    path = export_drafter(src, args.fmt, out, target=target)
    print(f"wrote {args.fmt} drafter to {path}")
    for note in export_caveats(src, args.fmt, target=target):
        print(f"warning: {note}", file=sys.stderr)
    return 0
