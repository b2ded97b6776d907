#!/bin/bash
# session 26, device call 3: run52's page-order test again (its block shuffle recursed)
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 200 python3 abtree/page_ab.py --label base --identity --blocks --dense --only 64x4k_p16,128x2k_p16,32x32k_p16,32x2k_p16 2>&1 | grep -v Warn | tee $OUT/page-ab3.txt
