#!/usr/bin/env python3
"""Writes a big build context for bench/run.sh: DIR/node_modules/ with many files of
random (incompressible) data, plus DIR/package.json and a Dockerfile that only needs
package.json.

    gen-node-modules.py DIR [TOTAL_MB] [FILE_KB]

Defaults: 500 MB (10^6 bytes) in 25 kB files (20 000 files, 20 per package directory,
1 000 package directories, each with a small package.json of its own).
"""
import os
import sys


def main() -> None:
    out = sys.argv[1]
    total = int(sys.argv[2] if len(sys.argv) > 2 else 500) * 1000 * 1000
    size = int(sys.argv[3] if len(sys.argv) > 3 else 25) * 1000
    per_pkg = 20
    nfiles = total // size
    os.makedirs(out, exist_ok=True)
    n = 0
    pkg = 0
    while n < nfiles:
        d = os.path.join(out, "node_modules", f"pkg-{pkg:04d}", "lib")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(out, "node_modules", f"pkg-{pkg:04d}", "package.json"), "w") as f:
            f.write('{"name": "pkg-%04d", "version": "1.0.0", "main": "lib/f00.js"}\n' % pkg)
        for i in range(per_pkg):
            if n >= nfiles:
                break
            with open(os.path.join(d, f"f{i:02d}.js"), "wb") as f:
                f.write(os.urandom(size))
            n += 1
        pkg += 1
    with open(os.path.join(out, "package.json"), "w") as f:
        f.write('{"name": "bench", "version": "0.0.0"}\n')
    with open(os.path.join(out, "Dockerfile"), "w") as f:
        f.write("FROM scratch\nCOPY package.json /\n")
    print(f"{n} files, {n * size} bytes in {pkg} packages")


if __name__ == "__main__":
    main()
