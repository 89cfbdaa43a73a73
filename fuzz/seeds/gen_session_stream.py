#!/usr/bin/env python3
"""Writes the session_stream seeds (the layout is described atop
fuzz_targets/session_stream.rs): python3 fuzz/seeds/gen_session_stream.py"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_stream")

# Indexes into the target's lists.
DIR = {"context": 0, "dockerfile": 1, "nope": 3, "../context": 4}
PAT = {"*": 0, "a.txt": 1, "dir": 2, "../outside": 5, "link-out": 9, "dirlink/secret": 12,
       "!a.txt": 14, "dir/up/secret": 20, "%2e%2e": 26}
FOL = {"link-out": 0, "abs-out": 1, "dirlink": 2, "dirlink/secret": 3, "dir/up/secret": 6,
       "Dockerfile": 9, "*": 10, "slash/etc/passwd": 13, "%2e%2e/outside": 16}


def header(mode=0, splits=(3,)):
    """Mode (7: raw HTTP/2), then the BytesMessage split sizes (byte % 4: 0 tiny or empty,
    1 16-byte steps, 2 ~16 KiB, 3 64 KiB)."""
    return bytes([mode, len(splits) - 1, *splits])


def diff_copy(dir_name="context", include=(), exclude=(), follow=(), encoded=(), packets=()):
    out = [1, 1, DIR[dir_name]]
    for key, values, table in (("include", include, PAT), ("exclude", exclude, PAT),
                               ("follow", follow, FOL)):
        out.append(len(values))
        for v in values:
            out += [1, table[v]]
        # <key>-encoded: 1 when asked
        out += [0, 0] if key in encoded else [1]
    out.append(len(packets))
    for p in packets:
        out += p
    return bytes(out)


def req(i):
    return [0, i]


FIN = [5]


def err(data=b"disk full"):
    return [6, len(data), *data]


def raw_req(n):
    return [4, *struct.pack("<I", n)]


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


os.makedirs(OUT, exist_ok=True)
# Health, credentials (push host), secret, agent; 64 KiB messages.
write("services", header() + bytes([0, 2, 0, 2, 1, 3, 0, 3, 1, 4, 0, 4, 3, 7, 0, 7, 7, 10]))
# The context in 17-byte messages: every file (ids 0, 1, 4, 5, 7, 10) asked for, then FIN.
write("diffcopy", header(splits=(5,)) + diff_copy(packets=[req(i) for i in (0, 1, 4, 5, 7, 10)] + [FIN]))
# Patterns and follow paths out of the root, escaped too; 1-byte and empty messages.
write("diffcopy-escape", header(splits=(1, 0, 9)) + diff_copy(
    include=("../outside", "link-out", "dirlink/secret"), exclude=("!a.txt",),
    follow=("link-out", "dirlink/secret", "dir/up/secret", "%2e%2e/outside"),
    encoded=("follow",), packets=[req(i) for i in range(8)] + [FIN]))
# The dockerfile dir; a REQ for an id never sent, ERR; garbage and a huge length.
write("diffcopy-bad", header(splits=(2,)) + diff_copy(
    dir_name="dockerfile", packets=[req(0), raw_req(0xFFFFFFFF), err()])
    + diff_copy(packets=[[8, 5, 0x0a, 0x03, 0x66, 0x6f, 0x6f]])
    + diff_copy(packets=[[10, 7, 3, 1, 2, 3], FIN])
    + diff_copy(dir_name="nope", packets=[FIN]))
# SSH forwarding: identities, a sign request, a disallowed kind, a huge length.
write("ssh", header() + bytes([5, 0, 3, 1, 0, 17, 1, 0, 13, 0, 2, 5]) + bytes([5, 2, 0]))
# The exporter's file in chunks, unknown methods, two calls at once, raw bodies.
write("filesend", header() + bytes([6, 3, 3, 1, 2, 3, 0, 5, ord("h"), ord("e"), ord("l"),
      ord("l"), ord("o")]) + bytes([7, 1, 7, 6, 10, 8, 1, 0, 1, 1, 1, 1, 4, 0, 0, 0, 0, 0]))
# Bytes injected amid the HTTP/2 frames.
write("inject", header() + bytes([0, 9, 8]) + b"\x00\x00\x00\x04\x00\x00\x00\x00")
# Mode 7: the preface, an empty SETTINGS, a HEADERS frame of garbage, a PING.
write("raw-h2", header(mode=7) + bytes([0])
      + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
      + b"\x00\x00\x05\x01\x05\x00\x00\x00\x01\x83\x86\x41\x8a\xff"
      + b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678")
