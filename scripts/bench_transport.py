"""What TLS and compression cost per message: ``lmqadmin bench`` over each transport.

    .venv/bin/python scripts/bench_transport.py [--runs 3] [--duration 5] [--size 100]
        [--transport plain --transport tls ...] [--markdown]

For each transport (``plain``, ``tls``, ``snappy``, ``deflate``, ``tls+snappy``,
``tls+deflate``) it runs ``scripts/bench_throughput.py``'s measurement (a fresh ``lmqd`` per run,
``lmqadmin bench --json`` against it, the daemon's CPU time divided by the messages consumed)
with the bench clients asking for that transport: ``lmqadmin --tls --tls-root-ca-file=...``,
``--snappy``, ``--deflate``. The daemon has a certificate made for the run (a throw-away test PKI,
``tests/transport/certs.py``) in every case, so only what the clients negotiate differs.

Prints the medians per transport and the daemon's extra CPU per message over plaintext.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_throughput import COLUMNS, run_once  # also puts the checkout's root on sys.path

from tests.transport.certs import make_certs  # the test PKI generator

TRANSPORTS: dict[str, list[str]] = {
    "plain": [],
    "tls": ["--tls"],
    "snappy": ["--snappy"],
    "deflate": ["--deflate"],
    "tls+snappy": ["--tls", "--snappy"],
    "tls+deflate": ["--tls", "--deflate"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--readers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--transport", action="append", choices=list(TRANSPORTS),
                        help="Transports to measure (repeatable; default: all).")
    parser.add_argument("--incompressible", action="store_true",
                        help="Random, all different bodies (lmqadmin bench --incompressible): "
                             "compression at its worst.")
    parser.add_argument("--dir", default=None, help="Where the data directories go (/tmp).")
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lmq-bench-pki-") as pki:
        certs = make_certs(Path(pki))
        daemon_flags = [
            f"--tls-cert={certs.server.cert}",
            f"--tls-key={certs.server.key}",
            "--https-address=",  # no HTTPS listener (nsqd's default is 0.0.0.0:4152)
        ]
        medians: dict[str, dict[str, Any]] = {}
        for name in args.transport or list(TRANSPORTS):
            admin = list(TRANSPORTS[name])
            if "--tls" in admin:
                admin.append(f"--tls-root-ca-file={certs.ca.cert}")
            run_args = argparse.Namespace(
                **vars(args), lmqd_flag=daemon_flags, admin_flag=admin,
                bench_flag=["--incompressible"] if args.incompressible else [],
            )
            results = []
            for i in range(args.runs):
                r = run_once(run_args, i)
                results.append(r)
                print(f"{name} run {i + 1}: load {r['load']}  "
                      f"consumed {r['consumed_per_s']:,.0f}/s  "
                      f"daemon CPU/msg {r['cpu_us_per_msg']:.2f} µs", file=sys.stderr, flush=True)
            medians[name] = {key: statistics.median(r[key] for r in results if r[key] is not None)
                             for _, key, _ in COLUMNS}

    base = medians.get("plain", {}).get("cpu_us_per_msg")
    shown = [c for c in COLUMNS if c[1] != "spilled_mb"]
    header = ["transport", *(label for label, _, _ in shown), "extra CPU/msg vs plain"]
    rows = []
    for name, m in medians.items():
        extra = f"{m['cpu_us_per_msg'] - base:+.2f} µs" if base is not None else "-"
        rows.append([name, *(fmt.format(m[key]) for _, key, fmt in shown), extra])
    bodies = "random, all different" if args.incompressible else "one repeated"
    print(f"{args.writers} writer(s), {args.readers} reader(s), {args.size} B messages "
          f"({bodies}), {args.runs} runs of {args.duration:g} s per transport (medians)\n")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- | " + " | ".join("---:" for _ in header[1:]) + " |")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in rows:
            print("  ".join(f"{h} {v}" for h, v in zip(header, row, strict=True)))


if __name__ == "__main__":
    main()
