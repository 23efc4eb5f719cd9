"""Advisor on the digits example: predict a held-out size, then run it and compare.

The issue's check (docs/advisor.md): on examples/train_digits.py at sizes 1-4, the advisor's
prediction for a size the job never ran at is within 15% of the throughput measured there.

One case (default: observe {1, 2, 4}, hold out 3) is two runs of the same job, L = 12
logical workers x 16 samples (global batch 192), ``--compute-sleep`` per micro-batch standing
in for compute (a sleep, so that 3-4 ranks scale on a 2-core machine):

1. an elastic run under the local launcher that starts at the largest observed size and
   shrinks through the others (planned leaves, scheduled by step); rank 0 writes the
   advisor's scaling report at the end (``--report``) and the time of every committed step
   (``--step-log``);
2. a fixed-size run at the held-out size, whose steady throughput is measured from rank 0's
   step log.

Measured throughput at a size = G / step time over the steady steps at that size (the first
``--skip`` steps of the run and after every resize are dropped); the step time is reported
both as the median (robust to the odd descheduled step) and as the mean (total samples /
total time, what the job actually gets); PASS/MISS is judged on the median against ``--tolerance``.
The observed sizes' measurements come from the elastic run itself, for reference.

    .venv/bin/python tests/bench/digits_heldout.py                       # {1,2,4} -> 3
    .venv/bin/python tests/bench/digits_heldout.py --case 1,2,3:4        # {1,2,3} -> 4
    .venv/bin/python tests/bench/digits_heldout.py --case 1,2,4:3 --case 1,2,3:4 --json out.json

Every process is started by the local launcher, which stops each by its pid (and on a
timeout kills them all); nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from malletrain.launcher import run_local

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_digits.py"


def parse_case(text: str) -> tuple[list[int], int]:
    obs, sep, held = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(
            f"--case: expected OBSERVED:HELD_OUT like 1,2,4:3, got {text!r}")
    try:
        sizes = sorted({int(s) for s in obs.split(",") if s.strip()})
        h = int(held)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--case: sizes must be integers, got {text!r}") from None
    if not sizes or min(sizes) < 1 or h < 1 or h in sizes:
        raise argparse.ArgumentTypeError(
            f"--case: observed sizes >= 1 and a held-out size not among them, got {text!r}")
    return sizes, h


def train_cmd(args, report: pathlib.Path | None, step_log: pathlib.Path, steps: int) -> list[str]:
    cmd = [sys.executable, str(EXAMPLE), "--logical-workers", str(args.logical_workers),
           "--batch-size", str(args.batch_size), "--compute-sleep", str(args.compute_sleep),
           "--steps", str(steps), "--step-log", str(step_log)]
    if report is not None:
        cmd += ["--report", str(report)]
    return cmd


def step_times(step_log: pathlib.Path, skip: int) -> dict[int, list[float]]:
    """Rank 0's step times by size, without the first ``skip`` steps of each stretch."""
    rows = [json.loads(line) for line in step_log.read_text().splitlines() if line.strip()]
    out: dict[int, list[float]] = {}
    run = 0  # steps since the start of this stretch at one size
    for prev, cur in zip(rows, rows[1:]):
        if cur["size"] != prev["size"] or cur["step"] != prev["step"] + 1:
            run = 0
            continue
        run += 1
        if run > skip:
            out.setdefault(cur["size"], []).append(cur["t"] - prev["t"])
    return out


def launch(args, cmd, nodes: int, schedule: str, log_dir: pathlib.Path, label: str):
    t0 = time.monotonic()
    job_id = "digits-" + "".join(c if c.isalnum() else "-" for c in label)
    res = run_local(cmd, nodes, schedule, job_id=job_id, timeout=args.timeout,
                    log_dir=str(log_dir), quiet=True)
    print(f"  {label}: {res.generations} generations, {res.wall_s:.0f} s, "
          f"{'ok' if res.ok else 'FAILED'} (wall {time.monotonic() - t0:.0f} s)", flush=True)
    if not res.ok:
        raise SystemExit(f"{label}: the run failed (exit codes {res.exit_codes}, timed out "
                         f"{res.timed_out}); logs in {log_dir}")
    return res


def summarize(times: list[float], g: int) -> dict:
    med = statistics.median(times)
    mean = statistics.fmean(times)
    return {"steps": len(times), "median_step_s": med, "mean_step_s": mean,
            "samples_per_s_median": g / med, "samples_per_s_mean": g / mean}


def run_case(args, observed: list[int], held: int, work: pathlib.Path) -> dict:
    g = args.logical_workers * args.batch_size
    name = f"{'-'.join(map(str, observed))}_to_{held}"
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    print(f"\ncase: observe {observed}, hold out {held}", flush=True)

    # 1. Elastic run through the observed sizes, largest first: planned leaves take effect
    # at the next step boundary, all members of one `leave K` together, whereas joiners warm
    # up (import torch, build the model) at their own pace and can arrive one by one, which
    # would run the job at the held-out size in between.
    sizes = sorted(observed, reverse=True)
    schedule = [f"step={args.steps_per_size * (i + 1)} leave {a - b}"
                for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
    total = args.steps_per_size * len(sizes)
    report_f, log_f = d / "report.json", d / "elastic_steps.jsonl"
    fixed_f = d / "fixed_steps.jsonl"
    for f in (report_f, log_f, fixed_f):  # the step logs are appended to
        f.unlink(missing_ok=True)
    launch(args, train_cmd(args, report_f, log_f, total), sizes[0], ", ".join(schedule),
           d / "elastic_logs", f"elastic {'->'.join(map(str, sizes))}")
    report = json.loads(report_f.read_text())
    elastic_times = step_times(log_f, args.skip)
    ran_at = sorted({json.loads(line)["size"] for line in log_f.read_text().splitlines()})
    if held in ran_at or held in report["sizes_observed"]:
        raise SystemExit(f"the elastic run ran at the held-out size {held} (sizes {ran_at}, "
                         f"advisor saw {report['sizes_observed']}): not a held-out check")

    # 2. Fixed-size run at the held-out size.
    launch(args, train_cmd(args, None, fixed_f, args.fixed_steps), held, "", d / "fixed_logs",
           f"fixed {held}")
    fixed_times = step_times(fixed_f, args.skip)

    curve = {c["nodes"]: c for c in report["curve"]}
    rows = []
    for n in sorted(set(observed) | {held}):
        src = fixed_times if n == held else elastic_times
        meas = summarize(src[n], g) if src.get(n) else None
        c = curve.get(n)
        row = {"nodes": n, "held_out": n == held, "measured": meas,
               "predicted": c["samples_per_s"] if c else None,
               "lo": c["lo"] if c else None, "hi": c["hi"] if c else None}
        if c and meas:
            row["error_vs_median"] = c["samples_per_s"] / meas["samples_per_s_median"] - 1
            row["error_vs_mean"] = c["samples_per_s"] / meas["samples_per_s_mean"] - 1
            row["in_band_median"] = c["lo"] <= meas["samples_per_s_median"] <= c["hi"]
        rows.append(row)
    return {"observed": observed, "held_out": held, "schedule": ", ".join(schedule),
            "elastic_steps": total, "elastic_sizes": ran_at, "fixed_steps": args.fixed_steps,
            "model": report["model"],
            "sizes_observed_by_advisor": report["sizes_observed"], "rows": rows}


def print_case(case: dict, tol: float) -> bool:
    print(f"\nobserved {case['observed']} (advisor fitted {case['sizes_observed_by_advisor']}), "
          f"held out {case['held_out']}; model rms error "
          f"{case['model']['rms_relative_error'] * 100:.1f}%, gamma {case['model']['gamma']:.2f}")
    print(f"{'nodes':>5}  {'':8}  {'predicted':>9}  {'band':>17}  {'meas.(median)':>13}  "
          f"{'err':>6}  {'meas.(mean)':>11}  {'err':>6}  {'steps':>5}  verdict")
    ok = True
    for r in case["rows"]:
        m = r["measured"]
        kind = "held-out" if r["held_out"] else "observed"
        pred = f"{r['predicted']:9.0f}" if r["predicted"] is not None else f"{'-':>9}"
        band = f"[{r['lo']:7.0f},{r['hi']:7.0f}]" if r["lo"] is not None else f"{'-':>17}"
        if m is None or r["predicted"] is None:
            print(f"{r['nodes']:5d}  {kind:8}  {pred}  {band}  (no measurement or prediction)")
            if r["held_out"]:
                ok = False
            continue
        verdict = ""
        if r["held_out"]:
            passed = abs(r["error_vs_median"]) <= tol
            ok = ok and passed
            verdict = f"{'PASS' if passed else 'MISS'} (|err| <= {tol * 100:.0f}%)"
        print(f"{r['nodes']:5d}  {kind:8}  {pred}  {band}  {m['samples_per_s_median']:13.0f}  "
              f"{r['error_vs_median'] * 100:+5.1f}%  {m['samples_per_s_mean']:11.0f}  "
              f"{r['error_vs_mean'] * 100:+5.1f}%  {m['steps']:5d}  {verdict}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", type=parse_case, action="append",
                   help="OBSERVED:HELD_OUT, e.g. 1,2,4:3 (default) or 1,2,3:4; repeatable")
    p.add_argument("--logical-workers", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--compute-sleep", type=float, default=0.01,
                   help="seconds of sleep per micro-batch (the job's 'compute')")
    p.add_argument("--steps-per-size", type=int, default=100,
                   help="steps at each observed size in the elastic run")
    p.add_argument("--fixed-steps", type=int, default=150)
    p.add_argument("--skip", type=int, default=10,
                   help="steps dropped at the start and after every resize when measuring")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    p.add_argument("--workdir", default=None, help="keep logs, reports and step logs here")
    p.add_argument("--json", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    cases = args.case or [([1, 2, 4], 3)]
    for obs, held in cases:
        if max(obs + [held]) > args.logical_workers:
            p.error(f"--case: sizes must be <= --logical-workers ({args.logical_workers})")

    print(f"digits held-out check: L = {args.logical_workers}, G = "
          f"{args.logical_workers * args.batch_size}, compute sleep {args.compute_sleep * 1e3:g} "
          f"ms per micro-batch, {os.cpu_count()} cores", flush=True)
    tmp = None
    if args.workdir:
        work = pathlib.Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="digits-heldout-")
        work = pathlib.Path(tmp.name)
    try:
        results = [run_case(args, obs, held, work) for obs, held in cases]
    finally:
        if tmp is not None:
            tmp.cleanup()
    all_ok = True
    for case in results:
        all_ok = print_case(case, args.tolerance) and all_ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "case"},
                       "cases": results}, f, indent=2)
    print(f"\n{'all held-out sizes within' if all_ok else 'NOT all held-out sizes within'} "
          f"{args.tolerance * 100:.0f}%")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
