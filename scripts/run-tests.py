#!/usr/bin/env python3
"""Runs the workspace's test binaries a few at a time instead of one by one.

Most of the suite's wall time is spent waiting (for a lease to expire, a
server to restart, a session to end), not computing, so `cargo test`'s one
binary at a time leaves the machine idle. This script builds every test
target (`cargo test --no-run`, the same flags), then runs the binaries on
`DISTLOCK_TEST_JOBS` lanes (2 by default), the longest first, and the doc
tests on one more job. Each binary runs as `cargo test` runs it: from its
package's directory, with `CARGO_MANIFEST_DIR` set; each keeps its own
servers on ports of its own (test-support picks free ports and retries a
start that lost its port). One risk is left: a server a test kills and
restarts on its port could find that port taken meanwhile by another
binary's new server (a port out of some 28 000, in the moment between the
kill and the restart); the restart then fails loudly.

A binary's output is printed whole when it ends, under the `Running` line
cargo would print, so the log reads as cargo's. How long each took is kept
in `target/test-times.tsv` to order the next run; the first run orders by
the estimates below.

Exit status: 0 when every binary and the doc tests passed, 1 otherwise
(the failed ones are listed at the end).
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
TIMES = TARGET / "test-times.tsv"
FLAGS = ["--workspace", "--all-features"]

# Seconds each binary took in a full run here (2 cores), for the first run
# on a fresh machine; a binary not listed counts as 5 s.
ESTIMATES = {
    "distlock-redis/safety": 106,
    "distlock-zk/safety": 105,
    "distlock-redis/conformance": 87,
    "distlock-redis/failover": 85,
    "distlock-redis/sentinel": 81,
    "distlock-redis/cluster": 51,
    "distlock-redis/review_liveness": 42,
    "distlock-zk/conformance": 41,
    "distlock-redis/liveness": 40,
    "distlock-redis/replicas": 37,
    "distlock-redis/redlock": 34,
    "distlock-zk/unknown_outcomes": 32,
    "distlock-redis/faults": 29,
    "distlock-core/conformance": 28,
    "distlock-cli/cli": 26,
    "distlock-redis/kinds": 26,
    "distlock-zk/zookeeper": 15,
    "distlock-zk/faults": 14,
    "doc-tests": 60,
}


def build():
    """Builds every test target; returns [(key, label, executable, cwd)]."""
    cmd = ["cargo", "test", *FLAGS, "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    jobs = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        manifest_dir = Path(msg["manifest_path"]).parent
        package = manifest_dir.name if manifest_dir != ROOT else "root"
        kinds = target["kind"]
        if "lib" in kinds or "rlib" in kinds or "proc-macro" in kinds:
            name, label = "lib", "unittests " + rel(target["src_path"], manifest_dir)
        else:
            name, label = target["name"], rel(target["src_path"], manifest_dir)
        if "bin" in kinds:
            name = "bin-" + name
        jobs.append((f"{package}/{name}", label, msg["executable"], manifest_dir))
    return jobs


def rel(path, base):
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return path


def load_times():
    times = dict(ESTIMATES)
    if TIMES.exists():
        for line in TIMES.read_text().splitlines():
            key, _, secs = line.partition("\t")
            try:
                times[key] = float(secs)
            except ValueError:
                pass
    return times


def main():
    lanes = int(os.environ.get("DISTLOCK_TEST_JOBS", "2"))
    jobs = build()
    times = load_times()
    queue = [(k, f"Running {label} ({exe})", [exe], cwd) for k, label, exe, cwd in jobs]
    queue.append(("doc-tests", "Doc-tests (cargo test --doc)", ["cargo", "test", *FLAGS, "--doc"], ROOT))
    queue.sort(key=lambda j: -times.get(j[0], 5.0))

    lock = threading.Lock()
    failed, took = [], {}

    def run(job):
        key, title, argv, cwd = job
        env = dict(os.environ, CARGO_MANIFEST_DIR=str(cwd))
        started = time.monotonic()
        with tempfile.TemporaryFile(mode="w+") as out:
            code = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
            out.seek(0)
            text = out.read()
        secs = time.monotonic() - started
        with lock:
            took[key] = secs
            print(f"     {title}", flush=True)
            sys.stdout.write(text)
            print(f"[{key}: {secs:.1f}s, exit {code}]", flush=True)
            if code != 0:
                failed.append(key)

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            run(job)

    threads = [threading.Thread(target=lane) for _ in range(max(1, lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    merged = load_times()
    merged.update(took)
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text("".join(f"{k}\t{v:.1f}\n" for k, v in sorted(merged.items())))
    if failed:
        print("failed: " + ", ".join(sorted(failed)), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
