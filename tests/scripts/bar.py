"""A rank that draws a progress bar on stderr (tqdm if installed, else by hand with "\\r")."""

from __future__ import annotations

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} starts", flush=True)
try:
    from tqdm import tqdm
except ImportError:
    for step in range(31):
        sys.stderr.write(f"\rrank{rank}: {step * 100 // 30:3d}%| {step}/30")
        sys.stderr.flush()
        time.sleep(0.02)
    sys.stderr.write("\n")
else:
    for _ in tqdm(range(30), desc=f"rank{rank}", file=sys.stderr, mininterval=0, ascii=True):
        time.sleep(0.02)
print(f"rank {rank} done", flush=True)
