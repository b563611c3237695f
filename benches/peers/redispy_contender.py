"""redis-py's Lock as one contending process of the cross-process bench.

usage: redispy_contender.py URL KEY ID SLEEP BARRIER

SLEEP is redis-py's polling interval (its default is 0.1 s). Prints the same
lines as the `contender` binary: "ready,ID", then after the barrier one
"acq,ID,0,ACQUIRE_NS,RELEASE_NS,WAIT_NS" per acquisition (time.monotonic_ns,
CLOCK_MONOTONIC on Linux), then "done,ID,COUNT,ERRORS".
"""
import os
import sys
import time

try:
    import redis
except ImportError:
    sys.exit("python3 package 'redis' is missing: run scripts/install-servers.sh")

url, key, pid, sleep, barrier = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
client = redis.Redis.from_url(url)
client.ping()
lock = client.lock(key, timeout=30, sleep=sleep)
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
        got = lock.acquire(blocking=True, blocking_timeout=remaining)
    except redis.RedisError as e:
        errors += 1
        print("redis-py %s: %s" % (pid, e), file=sys.stderr)
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
