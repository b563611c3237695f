"""kazoo's Lock as one contending process of the cross-process bench.

usage: kazoo_contender.py HOSTS PATH ID BARRIER

Prints the same lines as the `contender` binary: "ready,ID", then after the
barrier one "acq,ID,0,ACQUIRE_NS,RELEASE_NS,WAIT_NS" per acquisition
(time.monotonic_ns, CLOCK_MONOTONIC on Linux), then "done,ID,COUNT,ERRORS".
"""
import logging
import sys
import time

try:
    from kazoo.client import KazooClient
    from kazoo.exceptions import LockTimeout
except ImportError:
    sys.exit("python3 package 'kazoo' is missing: run scripts/install-servers.sh")

logging.basicConfig(level=logging.ERROR)
hosts, path, pid, barrier = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
zk = KazooClient(hosts=hosts)
zk.start(timeout=10)
lock = zk.Lock(path, "kazoo-" + pid)
print("ready," + pid, flush=True)

while True:
    try:
        with open(barrier) as f:
            parts = f.read().split()
        if len(parts) >= 2:
            start, end = int(parts[0]), int(parts[1])
            break
    except FileNotFoundError:
        pass
    time.sleep(0.001)
now = time.monotonic_ns()
if start > now:
    time.sleep((start - now) / 1e9)

samples = []
errors = 0
while time.monotonic_ns() < end:
    called = time.monotonic_ns()
    remaining = (end - called) / 1e9
    try:
        got = lock.acquire(timeout=remaining)
    except LockTimeout:
        break
    except Exception as e:  # noqa: BLE001 -- counted and reported
        errors += 1
        print("kazoo %s: %s" % (pid, e), file=sys.stderr)
        time.sleep(0.01)
        continue
    if not got:
        break
    acquired = time.monotonic_ns()
    released = time.monotonic_ns()
    lock.release()
    samples.append((acquired, released, acquired - called))

out = ["acq,%s,0,%d,%d,%d" % (pid, a, r, w) for (a, r, w) in samples]
out.append("done,%s,%d,%d" % (pid, len(samples), errors))
sys.stdout.write("\n".join(out) + "\n")
sys.stdout.flush()
zk.stop()
