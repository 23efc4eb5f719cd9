"""Where a park's time goes: the disk floor, the hash, and writes that skip the page cache.

Until file format v2 (2026-11-28) a park (libmalle/elastic/park_store.cc WriteStateFile) wrote
the state through the page cache in 16 MiB chunks and hashed every byte (HMAC-SHA256 / SHA-256,
OpenSSL) on a second thread; this probe showed why that was slow (v2 writes with O_DIRECT and
hashes chunks on every core; tests/bench/state_file_bench.cc times it). park_bench's floor is a plain write of the same bytes in 64 MiB chunks + fsync, the
best of two. This probe times, on the same bytes (252 MB, the resize_bench state's size) and
the same directory, in rotating order:

* floor: buffered write, 64 MiB chunks, fsync (park_bench's floor)
* buffered 16 MiB: the park's chunking, fsync
* O_DIRECT 16 MiB: from page-aligned memory, no page-cache copy (the disk DMAs from the
  buffer), fsync
* SHA-256 alone: hashlib (OpenSSL's, as ours), 16 MiB updates
* buffered 16 MiB + SHA-256 beside it (what a park does), and O_DIRECT + SHA-256 beside it.

    .venv/bin/python tests/bench/park_io_probe.py [--reps 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

N = 61524 * 4096  # 252.0 MB (the resize_bench state), a multiple of the 4 KiB O_DIRECT needs
CHUNK = 16 << 20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="default: a temporary directory under build/")
    args = p.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="park_io_probe.", dir=os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build"))
    os.makedirs(base, exist_ok=True)
    try:
        return probe(args, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


def probe(args, base: str) -> int:
    buf = mmap.mmap(-1, N)  # page-aligned, as O_DIRECT needs
    block = os.urandom(1 << 20)
    for off in range(0, N, 1 << 20):
        n = min(1 << 20, N - off)
        buf[off:off + n] = block[:n]
    mv = memoryview(buf)

    def write(path: str, chunk: int, direct: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        fd = os.open(path, flags, 0o600)
        try:
            off = 0
            while off < N:
                off += os.write(fd, mv[off:off + chunk])
            os.fsync(fd)
        finally:
            os.close(fd)

    def sha() -> None:
        h = hashlib.sha256()
        for off in range(0, N, CHUNK):
            h.update(mv[off:off + CHUNK])
        h.digest()

    def beside(fn) -> None:
        t = threading.Thread(target=sha)
        t.start()
        fn()
        t.join()

    path = os.path.join(base, "probe.bin")
    cases = {
        "floor (buffered 64 MiB + fsync)": lambda: write(path, 64 << 20, False),
        "buffered 16 MiB + fsync": lambda: write(path, CHUNK, False),
        "O_DIRECT 16 MiB + fsync": lambda: write(path, CHUNK, True),
        "SHA-256 alone": sha,
        "buffered 16 MiB + SHA-256 beside": lambda: beside(lambda: write(path, CHUNK, False)),
        "O_DIRECT 16 MiB + SHA-256 beside": lambda: beside(lambda: write(path, CHUNK, True)),
    }
    times = {k: [] for k in cases}
    loads = [os.getloadavg()[0]]
    names = list(cases)
    for r in range(args.reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            cases[k]()
            times[k].append(time.perf_counter() - t0)
            if os.path.exists(path):
                os.unlink(path)
        loads.append(os.getloadavg()[0])
    floor = times[names[0]]
    print(f"park_io_probe {time.strftime('%Y-%m-%d %H:%M')}: {N / 1e6:.0f} MB, {args.reps} reps, "
          f"load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    print(f"{'':36} {'median s':>9} {'min-max':>14} {'/ floor (per rep, median)':>26}")
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(v, floor))
        print(f"{k:36} {statistics.median(v):9.3f} {min(v):6.3f}-{max(v):6.3f} {ratio:26.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
