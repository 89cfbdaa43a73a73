#!/usr/bin/env python3
"""Where a polyarch run's time goes, from its `--output-format json` progress events.

    phases.py LOG T0 T_END [--brief]

With --overheads it prints only polyarch's own time outside the engine's work, as three
numbers in seconds: the start-up (process start to BuildKit's first step status), the
tail (the last platform pushed to the process's exit: index, read-back, record), and
polyarch's own part of the start-up (process start to the first unit's build phase, the
moment before the session opens and the solve is sent).

LOG holds one line per stderr line of `polyarch … --output-format json`, each prefixed
with the epoch time it arrived at (bench/run.sh stamps them: `EPOCH JSON`); T0 and T_END
are the epoch times the process was started and exited. Prints markdown: per phase, when
the first unit entered it, when the last unit left it, per-unit durations; the time
before the first event and after the last; the slowest build steps; the largest gaps. With several images, when each image's
platforms entered build and were done; --brief prints only that and the wall time.
"""
import json
import statistics
import sys

ORDER = ["plan", "probe", "emulation", "build", "export", "push", "publish", "verify", "done"]


def main() -> None:
    log, t0, t_end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    brief = "--brief" in sys.argv[4:]
    overheads = "--overheads" in sys.argv[4:]
    events = []  # (t, event dict or None, raw)
    for raw in open(log, encoding="utf-8", errors="replace"):
        raw = raw.rstrip("\n")
        if not raw:
            continue
        ts, _, rest = raw.partition(" ")
        try:
            t = float(ts)
        except ValueError:
            continue
        try:
            ev = json.loads(rest)
        except ValueError:
            ev = None
        events.append((t - t0, ev, rest))
    end = t_end - t0
    if overheads:
        first_step = next((t for t, ev, _ in events if ev and ev.get("event") == "step"), None)
        pushed = [t for t, ev, _ in events
                  if ev and ev.get("event") == "phase" and ev.get("phase") == "done" and ev.get("platform")]
        # polyarch's own share of the start-up: until a unit enters its build phase, right
        # before the session opens and the solve is sent; the rest is the engine's
        # frontend (session attach, Dockerfile parse, first vertex)
        building = next((t for t, ev, _ in events
                         if ev and ev.get("event") == "phase" and ev.get("phase") == "build"), None)
        if first_step is None or not pushed or building is None:
            sys.exit("phases.py: no build phase, step or per-platform done event: not a cold build?")
        print(f"{first_step:.3f} {end - max(pushed):.3f} {building:.3f}")
        return
    if not events:
        print(f"(no progress events; wall {end:.2f}s)")
        return

    def unit(ev):
        p = ev.get("platform")
        if isinstance(p, dict):
            p = "/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x)
        return f"{ev.get('image', '')} {p}" if p else ev.get("image", "")

    # phase entries per unit, in arrival order
    entries = {}  # unit -> [(t, phase)]
    steps = {}  # unit -> [(t, name)]
    for t, ev, _ in events:
        if not ev:
            continue
        kind = ev.get("event")
        if kind == "phase":
            lst = entries.setdefault(unit(ev), [])
            if not lst or lst[-1][1] != ev.get("phase"):
                lst.append((t, ev.get("phase")))
        elif kind == "step":
            steps.setdefault(unit(ev), []).append((t, ev.get("name", "")))

    # per-unit phase durations: a phase lasts until the unit's next phase entry; a unit's
    # last phase lasts until the unit's last event of any kind
    last_event = {}
    for t, ev, _ in events:
        if ev and ev.get("image") is not None:
            last_event[unit(ev)] = t
    spans = {}  # phase -> [(unit, start, stop)]
    for u, lst in entries.items():
        for i, (t, ph) in enumerate(lst):
            stop = lst[i + 1][0] if i + 1 < len(lst) else max(last_event.get(u, t), t)
            spans.setdefault(ph, []).append((u, t, stop))

    # per image: when its first unit entered build, when its last unit was done
    images = {}
    for u, lst in entries.items():
        img = u.split(" ")[0]
        for t, ph in lst:
            lo, hi = images.get(img, (None, None))
            if ph == "build":
                lo = t if lo is None else min(lo, t)
            if ph == "done":
                hi = t if hi is None else max(hi, t)
            images[img] = (lo, hi)
    per_image = ", ".join(
        f"{img} {'?' if lo is None else f'{lo:.2f}'}→{'?' if hi is None else f'{hi:.2f}'}s"
        for img, (lo, hi) in sorted(images.items(), key=lambda kv: (kv[1][0] is None, kv[1][0] or 0)))

    print(f"wall {end:.2f}s; first event at {events[0][0]:.2f}s (start-up: project, engine, plan); "
          f"last event at {events[-1][0]:.2f}s; exit {end - events[-1][0]:.2f}s after it (record, clean-up)")
    print()
    if len(images) > 1:
        print(f"Per image, first platform into build → last platform done: {per_image}.")
        print()
    if brief:
        return
    print("| phase | units | first in | last out | per unit: median | max |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for ph in ORDER + sorted(set(spans) - set(ORDER)):
        if ph not in spans:
            continue
        s = spans[ph]
        d = [b - a for _, a, b in s]
        print(f"| {ph} | {len(s)} | {min(a for _, a, _ in s):.2f}s | {max(b for _, _, b in s):.2f}s "
              f"| {statistics.median(d):.2f}s | {max(d):.2f}s |")
    print()

    # slowest build steps (a step lasts until the unit's next step or phase entry)
    slow = []
    for u, lst in steps.items():
        marks = sorted([t for t, _ in lst] + [t for t, _ in entries.get(u, [])])
        for t, name in lst:
            nxt = next((m for m in marks if m > t), last_event.get(u, t))
            slow.append((nxt - t, u, t, name))
    slow.sort(reverse=True)
    if slow:
        print("Slowest build steps (until the unit's next step or phase):")
        print()
        print("| step | unit | at | took |")
        print("| --- | --- | ---: | ---: |")
        for d, u, t, name in slow[:6]:
            print(f"| `{name[:70]}` | {u} | {t:.2f}s | {d:.2f}s |")
        print()

    # largest gaps between consecutive events of the whole run
    gaps = []
    prev = 0.0
    for t, ev, raw in events:
        what = raw
        if ev:
            kind = ev.get("event")
            detail = ev.get("message") or ev.get("name") or ev.get("line") or ""
            if kind == "bytes":
                detail = f"{ev.get('phase')} {ev.get('done')}/{ev.get('total')} bytes"
            what = f"{kind} {unit(ev) if ev.get('image') is not None else ''}: {detail}".strip()
        gaps.append((t - prev, t, what))
        prev = t
    gaps.append((end - prev, end, "(process exit)"))
    gaps.sort(reverse=True)
    print("Largest gaps between consecutive events (the time before the event named):")
    print()
    print("| gap | at | event |")
    print("| ---: | ---: | --- |")
    for g, t, what in gaps[:6]:
        what = what.replace("|", "\\|").replace("`", "'")[:110]
        print(f"| {g:.2f}s | {t:.2f}s | `{what}` |")


if __name__ == "__main__":
    main()
