"""kazoo's Lock, driven by distlock's interop tests.

usage: kazoo_lock.py HOSTS PATH hold SECONDS  -- acquire, print "acquired", hold, release, print "released"
"""
import sys
import time

try:
    from kazoo.client import KazooClient
except ImportError:
    sys.exit("python3 package 'kazoo' is missing: run scripts/install-servers.sh")

hosts, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
zk = KazooClient(hosts=hosts)
zk.start(timeout=10)
lock = zk.Lock(path, "kazoo")
if mode == "hold":
    lock.acquire(timeout=10)
    print("acquired", flush=True)
    time.sleep(float(sys.argv[4]))
    lock.release()
    print("released", flush=True)
else:
    sys.exit("unknown mode " + mode)
zk.stop()
