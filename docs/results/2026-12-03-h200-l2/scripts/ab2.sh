#!/usr/bin/env bash
# Call 6: flash-attn-4's d128 schedule has both the consumers' turns and the PV wait after the softmax. Each tree
# (abtree/: without _after_softmax; .: with it) times the prefill cells with the turns off and on (env_ab, two
# rounds, one process a tree).
# Usage: bash ab2.sh (from the repository root, abtree/ carried; $OUT)
set -u
export PYTHONUNBUFFERED=1
R=$OUT/ab2 && mkdir -p $R
C="M2 part: prefill,chunk 2k on 30k p16,GQA 32/8 causal 1x16k,d64 MHA 32 causal"
for tree in base new; do
  dir=.; [ $tree = base ] && dir=abtree
  ( cd $dir && PYTHONPATH=$PWD timeout 250 python3 -m benchmarks.env_ab --cells "$C" --rounds 2 --quiet \
      --variant free=ATTN_FUSED_HOPPER_PINGPONG=0 --variant turns=ATTN_FUSED_HOPPER_PINGPONG=1 --out $R/$tree \
      > $R/$tree.log 2>&1; echo "$tree rc=$?" )
  grep -E "^\| (M2|chunk|GQA|d64)" $R/$tree/env_ab.md | cut -d'|' -f2-6
done
