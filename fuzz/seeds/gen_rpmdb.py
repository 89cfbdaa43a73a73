#!/usr/bin/env python3
"""Writes the seeds in fuzz/seeds/rpmdb/ (run from anywhere): small rpm sqlite databases
(512-byte pages) whose Packages table holds header blobs as rpmdb stores them."""
import os
import sqlite3
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rpmdb")
NAME, VERSION, RELEASE, EPOCH, LICENSE, ARCH = 1000, 1001, 1002, 1003, 1014, 1022
INT32, STRING = 4, 6
SCHEMA = "CREATE TABLE 'Packages' (hnum INTEGER PRIMARY KEY AUTOINCREMENT,blob BLOB NOT NULL)"


def header(entries):
    index, data = b"", b""
    for tag, kind, value in entries:
        if kind == INT32:
            data += bytes(-len(data) % 4)
            item = struct.pack(">I", value)
        else:
            item = value.encode() + b"\0"
        index += struct.pack(">IIII", tag, kind, len(data), 1)
        data += item
    return struct.pack(">II", len(entries), len(data)) + index + data


def package(name, version, release, arch, licence, epoch=None):
    entries = [(NAME, STRING, name), (VERSION, STRING, version), (RELEASE, STRING, release),
               (LICENSE, STRING, licence), (ARCH, STRING, arch)]
    if epoch is not None:
        entries.append((EPOCH, INT32, epoch))
    return header(entries)


def database(name, blobs, schema=SCHEMA):
    path = os.path.join(OUT, name)
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA page_size = 512")
    db.executescript(schema)
    for blob in blobs:
        db.execute("INSERT INTO Packages (blob) VALUES (?)", (blob,))
    db.commit()
    db.execute("VACUUM")
    db.close()


os.makedirs(OUT, exist_ok=True)
database("two-packages.sqlite", [
    package("bash", "5.2.26", "3.fc40", "x86_64", "GPL-3.0-or-later", epoch=1),
    package("tzdata", "2024a", "5.fc40", "noarch", "Public Domain"),
])
# A header spilling into an overflow page, and one that is no header.
database("overflow-and-garbage.sqlite", [
    package("glibc", "2.39", "17.fc40", "aarch64", "LGPL-2.1-or-later AND " * 40 + "MIT"),
    b"\0\0\0\x01 not a header",
])
database("view.sqlite", [], "CREATE TABLE t (hnum, blob); CREATE VIEW Packages AS SELECT * FROM t")
