#!/usr/bin/env python3
"""Copies stdin to stdout, each line prefixed with the epoch time it arrived at
(`EPOCH LINE`), for bench/phases.py. Reads unbuffered so the stamps are arrival times."""
import sys
import time

inp = sys.stdin.buffer
out = sys.stdout.buffer
while True:
    line = inp.readline()
    if not line:
        break
    out.write(b"%.6f " % time.time() + line)
out.flush()
