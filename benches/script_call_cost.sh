#!/usr/bin/env bash
# What each redis.call inside a script costs in serial latency: one client
# (`redis-benchmark -c 1`) sends the same EVALSHA over and over, with the
# acquire script's 7 keys and 10 arguments, to scripts that do more and more
# of what a fenced acquisition does. Every variant ends with a DEL of the
# lock key, so each request takes the lock afresh.
#
# usage: benches/script_call_cost.sh [REQUESTS]   (default 20000, 3 passes)
#
# Prints, per pass, the requests per second and the µs per request of:
#   set        a plain SET NX PX (no script: the floor's acquire)
#   ping       PING (one round trip)
#   s_set      a script: SET NX PX GET
#   s_time     + TIME
#   s_fence    SET NX PX GET + SET fence PX GET (no TIME)
#   s_lean     SET NX PX GET + TIME + SET fence PX GET, inline
#   s_rule     the same through fence.lua's fence_next (the shipped rule)
#   s_acquire  distlock's acquire script as shipped (holds + fence + acquire)
# A redis-server on a free 127.0.0.1 port, started and stopped here.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
S=distlock-redis/src/scripts
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
RP=$!
trap 'kill $RP' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.1; done

# A script body run as a function, then the DEL that frees the lock again.
wrap() { printf 'local function body()\n%s\nend local r = body() redis.call("DEL", KEYS[1]) return r\n' "$1"; }
load() { redis-cli -p "$PORT" SCRIPT LOAD "$(wrap "$1")"; }
declare -A SHA
SHA[s_set]=$(load "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')")
SHA[s_time]=$(load "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
redis.call('TIME')")
SHA[s_fence]=$(load "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
redis.call('SET', KEYS[2], '12345', 'PX', ARGV[10], 'GET')")
LEAN="local v = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if v then return {0, 0, 0} end
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('SET', KEYS[2], string.format('%.0f', floor), 'PX', ARGV[10], 'GET')
return {1, floor, 0}"
SHA[s_lean]=$(load "$LEAN")
SHA[s_rule]=$(load "$(cat $S/fence.lua)
local v = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if v then return {0, 0, 0} end
return {1, fence_next(KEYS[2], redis.call('TIME'), ARGV[10]), 0}")
# The order scripts.rs concatenates the acquire script in.
SHA[s_acquire]=$(load "$(cat $S/holds.lua $S/fence.lua $S/acquire.lua)")

K='b:k'
KEYS="$K {$K}:fence {$K}:holder {$K}:waiting {$K}:handoff {$K}:waiting:alive {$K}:listening"
ARGS="00000000000000000000000000000000|owner 30000 owner prov1 1 0 0 1000 1000 30000"
run() {
  local name=$1
  shift
  local rps
  rps=$(redis-benchmark -p "$PORT" -c 1 -n "$N" -q "$@" | tr '\r' '\n' |
    grep 'requests per second' | tail -1 | sed 's/.*: //; s/ requests.*//')
  awk -v n="$name" -v r="$rps" 'BEGIN { printf "%-10s %10.0f req/s %7.1f µs\n", n, r, 1e6 / r }'
}
for pass in 1 2 3; do
  echo "pass $pass"
  run set SET "$K" tok NX PX 30000
  run ping PING
  for v in s_set s_time s_fence s_lean s_rule s_acquire; do
    # shellcheck disable=SC2086
    run "$v" EVALSHA "${SHA[$v]}" 7 $KEYS $ARGS
  done
done
