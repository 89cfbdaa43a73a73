#!/usr/bin/env python3
"""Writes the hand-made seeds in fuzz/seeds/elf/ (run from anywhere)."""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elf")
PT_LOAD, PT_INTERP = 1, 3


def elf(bits, little, machine, interp=None):
    e = "<" if little else ">"
    ehsize, phentsize = (64, 56) if bits == 64 else (52, 32)
    phnum = 2 if interp else 1
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 1 if little else 2, 1]) + bytes(9)
    if bits == 64:
        hdr = struct.pack(e + "HHIQQQIHHHHHH", 3 if interp else 2, machine, 1, 0x400000,
                          ehsize, 0, 0, ehsize, phentsize, phnum, 64, 0, 0)
    else:
        hdr = struct.pack(e + "HHIIIIIHHHHHH", 3 if interp else 2, machine, 1, 0x8000,
                          ehsize, 0, 0, ehsize, phentsize, phnum, 40, 0, 0)
    b = ident + hdr
    assert len(b) == ehsize
    interp_off = ehsize + phentsize * phnum
    path = interp.encode() + b"\0" if interp else b""
    if interp:
        if bits == 64:  # p_type p_flags p_offset p_vaddr p_paddr p_filesz p_memsz p_align
            b += struct.pack(e + "IIQQQQQQ", PT_INTERP, 4, interp_off, 0, 0, len(path), len(path), 1)
        else:  # p_type p_offset p_vaddr p_paddr p_filesz p_memsz p_flags p_align
            b += struct.pack(e + "IIIIIIII", PT_INTERP, interp_off, 0, 0, len(path), len(path), 4, 1)
    if bits == 64:
        b += struct.pack(e + "IIQQQQQQ", PT_LOAD, 5, 0, 0x400000, 0x400000, 0x100, 0x100, 0x1000)
    else:
        b += struct.pack(e + "IIIIIIII", PT_LOAD, 0, 0x8000, 0x8000, 0x100, 0x100, 5, 0x1000)
    return b + path + b"\xcc" * 16


seeds = {
    "x86_64-dynamic.elf": elf(64, True, 62, "/lib64/ld-linux-x86-64.so.2"),
    "aarch64-static.elf": elf(64, True, 183),
    "arm32-dynamic.elf": elf(32, True, 40, "/lib/ld-linux-armhf.so.3"),
    "s390x-be-dynamic.elf": elf(64, False, 22, "/lib/ld64.so.1"),
    "truncated.elf": elf(64, True, 62, "/lib64/ld-linux-x86-64.so.2")[:40],
    "script.sh": b"#!/bin/sh\nexec /app \"$@\"\n",
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
