#!/usr/bin/env python3
"""interleave.py — compare CPU configurations of nstf in one run, interleaved.

On a machine shared with other work the speed drifts by more than the
differences measured here, so each round runs every variant once, in turn,
and the summary gives each variant's best and median over the rounds (the
best is the least disturbed run; the median ratio says whether the order
holds in every round). Each run is `BINARY bench -m MODEL -p P -n N -r 1
--no-warmup -o csv ARGS`.

usage: python3 bench/cpu/interleave.py [--rounds R] [-p P] [-n N] MODEL 'LABEL|BINARY|ARGS' ...
  e.g. 'a16|build/nstf|--act-bits 16' 'a8|build/nstf|--act-bits 8'
"""
import argparse
import csv
import io
import os
import shlex
import statistics
import subprocess


def run(binary, model, p, n, args):
    cmd = [binary, "bench", "-m", model, "-p", str(p), "-n", str(n), "-r", "1", "--no-warmup", "-o", "csv"]
    out = subprocess.run(cmd + shlex.split(args), capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    pp = [float(r["avg_ts"]) for r in rows if int(r["n_prompt"]) > 0]
    tg = [float(r["avg_ts"]) for r in rows if int(r["n_gen"]) > 0]
    return (pp[0] if pp else None), (tg[0] if tg else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("model")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    vs = [v.split("|", 2) for v in a.variants]
    res = {lab: {"pp": [], "tg": []} for lab, _, _ in vs}
    loads = []
    for _ in range(a.rounds):
        loads.append(os.getloadavg()[0])
        for lab, binary, args in vs:
            pp, tg = run(binary, a.model, a.p, a.n, args)
            if pp is not None:
                res[lab]["pp"].append(pp)
            if tg is not None:
                res[lab]["tg"].append(tg)
    base = vs[0][0]
    print(f"{a.rounds} rounds, load average {min(loads):.1f} .. {max(loads):.1f} (1 min)")
    print(f"| variant | pp{a.p} best | pp{a.p} median | tg{a.n} best | tg{a.n} median | tg median ratio to {base} |")
    print("|---|---:|---:|---:|---:|---:|")
    for lab, _, _ in vs:
        pp, tg = res[lab]["pp"], res[lab]["tg"]
        ratios = [t / b for t, b in zip(tg, res[base]["tg"])]
        print(f"| {lab} | {max(pp):.1f} | {statistics.median(pp):.1f} | {max(tg):.1f} | {statistics.median(tg):.1f} | "
              f"{statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    main()
