#!/usr/bin/env python3
"""Summarises `strace -f -tt -s 64 -e trace=connect,openat,sendto,write,writev` output of
one polyarch run for bench/run.sh: the HTTP requests it sent to the engine and to the
registry (method and path, counted), the files it opened, and where the wall time went
between the first and the last request.

    syscalls.py STRACE_FILE
"""
import collections
import re
import sys

REQ = re.compile(r'"(GET|HEAD|POST|PUT|PATCH|DELETE) (/[^ "\\]*)')


def kind(path: str) -> str:
    if path.startswith("/v2/"):
        # registry: drop digests and references, keep the operation
        p = re.sub(r"sha256:[0-9a-f]{6,}", "sha256:…", path)
        p = re.sub(r"^/v2/[^?]*?/(manifests|blobs)/", r"/v2/REPO/\1/", p)
        p = re.sub(r"\?.*", "", p)
        return "registry " + p
    p = re.sub(r"^/v1\.\d+", "", path)
    p = re.sub(r"\?.*", "", p)
    p = re.sub(r"/[0-9a-f]{12,}", "/ID", p)
    return "engine " + p


def main() -> None:
    reqs = collections.Counter()
    first = {}
    opens = 0
    certs = 0
    times = []
    for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        try:
            h, m, s = parts[1].split(":")
            t = int(h) * 3600 + int(m) * 60 + float(s)
        except ValueError:
            continue
        times.append(t)
        call = parts[2]
        if call.startswith("openat("):
            opens += 1
            if "/etc/ssl/" in call or "/usr/share/ca-certificates" in call:
                certs += 1
        elif call.startswith(("sendto(", "write(", "writev(")):
            m_ = REQ.search(call)
            if m_:
                k = f"{m_.group(1)} {kind(m_.group(2))}"
                reqs[k] += 1
                first.setdefault(k, t)
    if not times:
        print("(no strace output)")
        return
    t0 = times[0]
    eng = sum(n for k, n in reqs.items() if " engine " in k)
    reg = sum(n for k, n in reqs.items() if " registry " in k)
    print(f"{eng} engine API requests, {reg} registry requests, {opens} files opened "
          f"({certs} of them CA certificates under /etc/ssl or /usr/share/ca-certificates):")
    print()
    print("| request | count | first at |")
    print("| --- | ---: | ---: |")
    for k, n in sorted(reqs.items(), key=lambda kv: first[kv[0]]):
        print(f"| `{k}` | {n} | {first[k] - t0:.3f}s |")


if __name__ == "__main__":
    main()
