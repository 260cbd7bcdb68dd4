#!/bin/sh
# plain-mode steps without taps (this revision) against the revision before it (bfffc3d, checked
# out at $BEFORE) and plain decoding, interleaved by round, at 16 and 32 requests.
#   git worktree add /tmp/before bfffc3d && BEFORE=/tmp/before sh benchmarks/sweep-s37/plain-mode.sh
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s37/plain-mode}" --configs \
  "none=$S --speculative-config none" \
  "default=$S" \
  "before=cd $BEFORE && PYTHONPATH=$BEFORE $S" \
  --concurrency 16,32 --rounds "${ROUNDS:-4}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
