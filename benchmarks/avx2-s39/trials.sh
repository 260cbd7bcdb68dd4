#!/bin/sh
# the default configuration as it was run here (plain-decoding fallback from 8 requests,
# plain trials from 2, the drafter's confidences earned per request; the trials from 2
# were taken out of the default afterwards) against the one before (fallback from 8
# only, the confidence head's word) and plain decoding, served, all three servers up,
# configurations interleaved by round, on a 2-core AVX2-only AMD EPYC.
#   sh benchmarks/avx2-s39/trials.sh          (OUT=runs/measure-s39/trials, 3 rounds)
cd "$(dirname "$0")/../.."
S="python3 -m dspark.cli.main serve --host 127.0.0.1 --port {port}"
dspark bench sweep --out "${OUT:-runs/measure-s39/trials}" --configs \
  "none=$S --speculative-config none" \
  'before={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "drafter_trust": false}' \
  'default={"method": "dspark", "enable_adaptive_verification": true, "lookup": true, "plain_fallback": 8, "plain_trials_from": 2}' \
  --concurrency 1,4,16 --rounds "${ROUNDS:-3}" --max-tokens 64 --dataset mixed --ignore-eos --num-prompts 32 --reference none --disable-tqdm
