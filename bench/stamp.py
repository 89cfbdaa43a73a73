#!/usr/bin/env python3
"""Copies stdin to stdout, each line prefixed with the epoch time it arrived at
(`EPOCH LINE`), for bench/phases.py. Reads unbuffered so the stamps are arrival times.

    stamp.py [FIFO READY]

With FIFO and READY it reads FIFO instead of stdin, creating READY just before it opens
it: a caller that waits for READY before starting the writer gets every line stamped on
arrival, never held back by this interpreter's own start-up."""
import os
import sys
import time

if len(sys.argv) == 3:
    open(sys.argv[2], "w").close()
    inp = open(sys.argv[1], "rb", buffering=0)
else:
    inp = sys.stdin.buffer
out = sys.stdout.buffer
pending = b""
while True:
    chunk = os.read(inp.fileno(), 65536)
    if not chunk:
        break
    t = time.time()
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        out.write(b"%.6f " % t + line + b"\n")
if pending:
    out.write(b"%.6f " % time.time() + pending + b"\n")
out.flush()
