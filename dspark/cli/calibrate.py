"""`dspark calibrate`: Sequential Temperature Scaling of a DSpark drafter's confidences."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import add_model_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit a DSpark drafter's per-position confidence temperatures (STS) on held-out data",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Sequential Temperature Scaling: for k = 1..gamma in order, a grid search picks the "
                    "temperature of position k minimising the ECE of the survival c_1*...*c_k against the "
                    "observed prefix acceptance on held-out responses (teacher-forced), earlier positions "
                    "fixed. Writes DRAFTER/calibration.json (read by the drafter loader) and a reliability "
                    "diagram; prints ECE per position and overall, Brier score and AUROC before and after.\n\n"
                    "--acceptance greedy (default): a prefix counts as accepted when every drafted token equals "
                    "the target's argmax; exact for held-out replies generated greedily "
                    "(dspark data generate --split heldout --temperature 0).\n"
                    "--acceptance analytic: the prefix acceptance probability of sampling verification, "
                    "prod_j (1 - TV(q_j, p_j)).",
    )
    p.add_argument("--drafter", required=True, metavar="DIR", help="a dspark drafter checkpoint directory")
    p.add_argument("--data", action="append", required=True, metavar="HELDOUT.jsonl",
                   help="held-out regenerated responses (repeatable)")
    p.add_argument("--acceptance", choices=["greedy", "analytic"], default="greedy", help="(default: %(default)s)")
    p.add_argument("--blocks-per-seq", type=int, default=64,
                   help="anchors per forward and response; every response position is an anchor (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=4, help="responses per forward (default: %(default)s)")
    p.add_argument("--bins", type=int, default=15, help="ECE bins (default: %(default)s)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="reliability diagram path (default: DRAFTER/reliability.png)")
    p.add_argument("--dry-run", action="store_true", help="report only; do not write calibration.json")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dspark.drafters import load_drafter
    from dspark.errors import UserError
    from dspark.eval.calibration import reliability_diagram
    from dspark.train.data import end_of_turn_id, load_sequences
    from dspark.train.sts import calibration_report, collect_confidences, fit_sts
    from dspark.train.teacher import OnTheFlyTeacher

    from .common import load_target

    if args.blocks_per_seq < 1 or args.batch_size < 1 or args.bins < 2:
        raise UserError("--blocks-per-seq and --batch-size must be >= 1 and --bins >= 2")
    target = load_target(args)
    drafter = load_drafter(args.drafter, target.model)
    if drafter.method != "dspark" or getattr(drafter, "confidence_head", None) is None:
        raise UserError(f"{args.drafter} is a {drafter.method} drafter without a confidence head; "
                        "only dspark drafters are calibrated")
    seqs = load_sequences(args.data, end_of_turn_id(target.tokenizer), args.max_model_len)
    teacher = OnTheFlyTeacher(target.model, drafter.target_layer_ids, seqs)
    data = collect_confidences(drafter, teacher, seqs, args.blocks_per_seq, args.batch_size, args.acceptance,
                               progress=not args.json)
    gamma = data.logits.shape[1]
    ones = [1.0] * gamma
    temps = fit_sts(data, num_bins=args.bins)
    before = calibration_report(data, ones, args.bins)
    after = calibration_report(data, temps, args.bins)
    plot = Path(args.plot) if args.plot else Path(args.drafter) / "reliability.png"
    valid = data.valid
    reliability_diagram(
        plot,
        {"raw": (data.survival(ones)[valid].numpy(), data.accepted[valid].numpy()),
         "STS": (data.survival(temps)[valid].numpy(), data.accepted[valid].numpy())},
        {"raw": before["per_position_ece"], "STS": after["per_position_ece"]},
        title=f"{Path(args.drafter).name}: survival vs {args.acceptance} prefix acceptance",
        num_bins=args.bins,
    )
    report = {"temperatures": [round(t, 4) for t in temps], "method": "sts", "acceptance": args.acceptance,
              "num_sequences": len(seqs), "num_blocks": int(data.logits.shape[0]),
              "data": [str(d) for d in args.data], "bins": args.bins, "before": before, "after": after,
              "reliability_diagram": str(plot)}
    if not args.dry_run:
        (Path(args.drafter) / "calibration.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"STS on {report['num_blocks']} blocks of {len(seqs)} held-out responses ({args.acceptance} acceptance)")
    print(f"{'k':>3} {'T_k':>7} {'accept':>7} {'surv raw':>8} {'surv STS':>8} {'ECE raw':>8} {'ECE STS':>8}")
    for k in range(gamma):
        print(f"{k + 1:>3} {temps[k]:>7.3f} {before['observed_acceptance'][k]:>7.3f} "
              f"{before['mean_survival'][k]:>8.3f} {after['mean_survival'][k]:>8.3f} "
              f"{before['per_position_ece'][k]:>8.4f} {after['per_position_ece'][k]:>8.4f}")
    for name, r in (("raw", before), ("STS", after)):
        print(f"{name:>4}: ECE {r['ece']:.4f}  Brier {r['brier']:.4f}  AUROC {r['auroc']:.4f}")
    print(f"reliability diagram: {plot}")
    if not args.dry_run:
        print(f"wrote {Path(args.drafter) / 'calibration.json'}")
    return 0
