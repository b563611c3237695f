"""redis-py's Lock, driven by distlock's interop tests.

usage: redis_py_lock.py URL KEY hold SECONDS   -- acquire, print "acquired", hold, release, print "released"
       redis_py_lock.py URL KEY try            -- print "acquired" or "busy" (non-blocking)
"""
import sys
import time

try:
    import redis
except ImportError:
    sys.exit("python3 package 'redis' is missing: run scripts/install-servers.sh")

url, key, mode = sys.argv[1], sys.argv[2], sys.argv[3]
client = redis.Redis.from_url(url)
lock = client.lock(key, timeout=30)
if mode == "hold":
    if not lock.acquire(blocking=True, blocking_timeout=10):
        sys.exit("could not acquire")
    print("acquired", flush=True)
    time.sleep(float(sys.argv[4]))
    lock.release()
    print("released", flush=True)
elif mode == "try":
    got = lock.acquire(blocking=False)
    print("acquired" if got else "busy", flush=True)
    if got:
        lock.release()
else:
    sys.exit("unknown mode " + mode)
