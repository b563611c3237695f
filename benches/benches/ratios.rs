//! The uncontended performance targets as ratios, measured interleaved:
//! each round times one floor operation and then one distlock operation on
//! the same servers, so machine noise hits both alike. Prints medians and
//! ratios; `cargo bench -p distlock-benches --bench ratios`.
//! `DISTLOCK_BENCH_ROUNDS` sets the rounds (default 3000).

use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

use distlock::redis::redis;
use distlock::redis::RedisProvider;
use distlock::zk::zookeeper_client::{self, Acls, CreateMode};
use distlock::zk::{ZkOptions, ZkProvider};
use distlock::Provider;
use test_support::{RedisServer, ZkCluster};

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// What the wire allows a lock with a fencing token floored at the
/// server's clock (the crate docs, Fencing tokens): the fewest calls such
/// an acquisition can run, `SET NX PX … GET`, `TIME`, `SET` of the counter
/// `… GET`. KEYS[1] lock, KEYS[2] counter; ARGV[1] value, ARGV[2] TTL ms.
const FENCED_ACQUIRE_LUA: &str = "
local held = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if held then return {0, 0} end
local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[2], 'GET'))
if old and old >= token then
  token = old + 1
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[2])
end
return {1, token}";

/// Its release: compare-and-delete, then one look for anyone waiting
/// (`EXISTS`), the least a release that hands over must do.
const FENCED_RELEASE_LUA: &str = "
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then return 2 end
return 1";

/// distlock's own two scripts (the plain mutex's acquire and release, with
/// their preludes in the order `distlock-redis/src/scripts.rs` gives), to
/// be run raw: the server's share of a lock + release without the
/// client's. Their KEYS and ARGV are in each file's opening lines.
const OUR_ACQUIRE_LUA: &str = concat!(
    include_str!("../../distlock-redis/src/scripts/holds.lua"),
    include_str!("../../distlock-redis/src/scripts/fence.lua"),
    include_str!("../../distlock-redis/src/scripts/acquire.lua")
);
const OUR_RELEASE_LUA: &str = concat!(
    include_str!("../../distlock-redis/src/scripts/holds.lua"),
    include_str!("../../distlock-redis/src/scripts/queue.lua"),
    include_str!("../../distlock-redis/src/scripts/line_pop.lua"),
    include_str!("../../distlock-redis/src/scripts/mutex_release.lua")
);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn time<F: Future<Output = ()>>(f: F) -> Duration {
    let start = Instant::now();
    f.await;
    start.elapsed()
}

struct Pair {
    what: &'static str,
    floor: &'static str,
    target: &'static str,
    floor_median: Duration,
    subject_median: Duration,
}

fn main() {
    let rounds: usize = std::env::var("DISTLOCK_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let redis_server = RedisServer::start();
    let zk_server = ZkCluster::standalone();
    let pairs = rt.block_on(async {
        let mut pairs = Vec::new();

        // Redis: raw SET NX PX + EVALSHA compare-and-delete vs distlock lock + release.
        let client = redis::Client::open(redis_server.url()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let release = redis::Script::new(RELEASE_LUA);
        let locks = RedisProvider::connect(&redis_server.url())
            .await
            .expect("redis");
        let mutex = locks.mutex("ratio/redis").expect("name");
        let rslock = rslock::LockManager::new(vec![redis_server.url()]);
        let fenced = (
            redis::Script::new(FENCED_ACQUIRE_LUA),
            redis::Script::new(FENCED_RELEASE_LUA),
        );
        let scripts = (
            redis::Script::new(OUR_ACQUIRE_LUA),
            redis::Script::new(OUR_RELEASE_LUA),
        );
        // The keys distlock's mutex uses for a name (its keyspace table).
        let k = "ratio/scripts";
        let acquire_keys: Vec<String> = std::iter::once(k.to_owned())
            .chain(
                [
                    "fence",
                    "holder",
                    "waiting",
                    "handoff",
                    "waiting:alive",
                    "listening",
                ]
                .iter()
                .map(|s| format!("{{{k}}}:{s}")),
            )
            .collect();
        let release_keys: Vec<String> = std::iter::once(k.to_owned())
            .chain(
                [
                    "fair:queue",
                    "fair:timeouts",
                    "holder",
                    "fair:owners",
                    "waiting",
                    "handoff",
                    "waiting:alive",
                    "listening",
                ]
                .iter()
                .map(|s| format!("{{{k}}}:{s}")),
            )
            .collect();
        let (mut floor, mut ours, mut peer, mut ping) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut wire, mut raw_scripts) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let c = &mut conn;
            ping.push(
                time(async {
                    let _: String = redis::cmd("PING").query_async(c).await.expect("ping");
                })
                .await,
            );
            floor.push(
                time(async {
                    let _: Option<String> = redis::cmd("SET")
                        .arg("ratio/raw")
                        .arg("token")
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(c)
                        .await
                        .expect("set");
                    let _: i64 = release
                        .key("ratio/raw")
                        .arg("token")
                        .invoke_async(c)
                        .await
                        .expect("del");
                })
                .await,
            );
            ours.push(
                time(async {
                    let g = mutex.lock().await.expect("lock");
                    g.release().await.expect("release");
                })
                .await,
            );
            let value = format!("{round:032x}|ratio");
            wire.push(
                time(async {
                    let (status, _): (i64, u64) = fenced
                        .0
                        .key("ratio/fenced")
                        .key("{ratio/fenced}:fence")
                        .arg(&value)
                        .arg(30_000)
                        .invoke_async(c)
                        .await
                        .expect("fenced acquire");
                    assert_eq!(status, 1, "the fenced floor's lock is free");
                    let released: i64 = fenced
                        .1
                        .key("ratio/fenced")
                        .key("{ratio/fenced}:waiting")
                        .arg(&value)
                        .invoke_async(c)
                        .await
                        .expect("fenced release");
                    assert_eq!(released, 1, "the fenced floor's lock was ours");
                })
                .await,
            );
            raw_scripts.push(
                time(async {
                    let mut acquire = scripts.0.prepare_invoke();
                    for key in &acquire_keys {
                        acquire.key(key);
                    }
                    // As `RedisMutex` sends a first attempt of `lock()`.
                    acquire
                        .arg(&value)
                        .arg(30_000)
                        .arg("ratio")
                        .arg("pratio")
                        .arg("1")
                        .arg("0")
                        .arg("0")
                        .arg(1_000)
                        .arg(1_000)
                        .arg(30_000);
                    let (status, _, _): (i64, u64, i64) =
                        acquire.invoke_async(c).await.expect("our acquire");
                    assert_eq!(status, 1, "our scripts' lock is free");
                    let mut release = scripts.1.prepare_invoke();
                    for key in &release_keys {
                        release.key(key);
                    }
                    release.arg(&value).arg("ratio:released").arg(50);
                    let released: i64 = release.invoke_async(c).await.expect("our release");
                    assert_eq!(released, 1, "our scripts' lock was ours");
                })
                .await,
            );
            peer.push(
                time(async {
                    let l = rslock
                        .lock("ratio/rslock", Duration::from_secs(30))
                        .await
                        .expect("rslock");
                    rslock.unlock(&l).await;
                })
                .await,
            );
        }
        let floor_median = median(floor);
        let (ours, wire) = (median(ours), median(wire));
        pairs.push(Pair {
            what: "redis/mutex lock+release",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "≤ 1.15",
            floor_median,
            subject_median: ours,
        });
        pairs.push(Pair {
            what: "redis fenced floor (3 + 3 calls in 2 scripts, raw)",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "-",
            floor_median,
            subject_median: wire,
        });
        pairs.push(Pair {
            what: "redis/mutex's two scripts, raw",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "-",
            floor_median,
            subject_median: median(raw_scripts),
        });
        pairs.push(Pair {
            what: "redis/mutex lock+release",
            floor: "the fenced floor",
            target: "-",
            floor_median: wire,
            subject_median: ours,
        });
        let peer = median(peer);
        pairs.push(Pair {
            what: "rslock lock+unlock (peer)",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "-",
            floor_median,
            subject_median: peer,
        });
        pairs.push(Pair {
            what: "redis/mutex lock+release",
            floor: "rslock lock+unlock (no fencing token)",
            target: "≤ 1.05",
            floor_median: peer,
            subject_median: ours,
        });
        pairs.push(Pair {
            what: "redis PING (one round trip)",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "-",
            floor_median,
            subject_median: median(ping),
        });

        // ZooKeeper: raw ephemeral sequential create + delete vs the mutexes.
        let zk = zookeeper_client::Client::connect(&zk_server.connect_string())
            .await
            .expect("zk");
        zk.mkdir(
            "/ratio",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .expect("mkdir");
        let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let locks = ZkProvider::connect_with(ZkOptions::new(zk_server.connect_string()))
            .await
            .expect("zk provider");
        let fair = locks.fair_mutex("ratio/fair").expect("name");
        let unfair = locks.mutex("ratio/unfair").expect("name");
        zk.mkdir(
            "/ratio-fair",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .expect("mkdir");
        let (mut floor, mut fair_t, mut unfair_t) = (Vec::new(), Vec::new(), Vec::new());
        let mut fair_floor = [Vec::new(), Vec::new()];
        for _ in 0..rounds / 3 {
            floor.push(
                time(async {
                    let (_, seq) = zk
                        .create("/ratio/n-", &[], &ephemeral)
                        .await
                        .expect("create");
                    zk.delete(&format!("/ratio/n-{seq}"), None)
                        .await
                        .expect("delete");
                })
                .await,
            );
            // What the wire allows a fair lock that tells whether it is
            // first (the create with the listing pipelined behind it: one
            // round trip) and then deletes its node; sent raw on one
            // session. `watched`: and hears its node's deletion or a
            // request to release meanwhile (the crate docs, "The recipes"):
            // the node's data watch, sent before the delete.
            for watched in [false, true] {
                let took = time(async {
                    let creating = zk.create("/ratio-fair/n-", &[], &ephemeral);
                    let listing = zk.get_children("/ratio-fair");
                    let (created, listed) = futures::join!(creating, listing);
                    let (_, seq) = created.expect("create");
                    let (children, _) = listed.expect("list");
                    assert_eq!(children.len(), 1, "alone in the queue");
                    let node = format!("/ratio-fair/n-{seq}");
                    if watched {
                        let watching = zk.get_and_watch_data(&node);
                        let deleting = zk.delete(&node, Some(0));
                        let (watch, deleted) = futures::join!(watching, deleting);
                        let (_, _, watcher) = watch.expect("watch");
                        deleted.expect("delete");
                        watcher.changed().await;
                    } else {
                        zk.delete(&node, Some(0)).await.expect("delete");
                    }
                })
                .await;
                fair_floor[usize::from(watched)].push(took);
            }
            fair_t.push(
                time(async {
                    let g = fair.lock().await.expect("lock");
                    g.release().await.expect("release");
                })
                .await,
            );
            unfair_t.push(
                time(async {
                    let g = unfair.lock().await.expect("lock");
                    g.release().await.expect("release");
                })
                .await,
            );
        }
        let floor_median = median(floor);
        let fair_median = median(fair_t);
        pairs.push(Pair {
            what: "zk/fair_mutex lock+release",
            floor: "raw create (ephemeral sequential) + delete",
            target: "≤ 1.3 (next: 1.25)",
            floor_median,
            subject_median: fair_median,
        });
        let [unwatched, watched] = fair_floor;
        let unwatched = median(unwatched);
        pairs.push(Pair {
            what: "zk fair floor (create + listing pipelined, delete; raw)",
            floor: "raw create (ephemeral sequential) + delete",
            target: "-",
            floor_median,
            subject_median: unwatched,
        });
        pairs.push(Pair {
            what: "zk/fair_mutex lock+release",
            floor: "the zk fair floor (without the watch: it waits 20 ms)",
            target: "-",
            floor_median: unwatched,
            subject_median: fair_median,
        });
        pairs.push(Pair {
            what: "zk fair floor with the node's data watch (raw)",
            floor: "raw create (ephemeral sequential) + delete",
            target: "-",
            floor_median,
            subject_median: median(watched),
        });
        pairs.push(Pair {
            what: "zk/unfair_mutex lock+release",
            floor: "raw create (ephemeral sequential) + delete",
            target: "≤ 1.3",
            floor_median,
            subject_median: median(unfair_t),
        });
        pairs
    });
    let mut table = String::from(
        "| measured | floor | floor median (µs) | median (µs) | ratio | target |\n|---|---|---:|---:|---:|---|\n",
    );
    for p in &pairs {
        let _ = writeln!(
            table,
            "| {} | {} | {:.1} | {:.1} | {:.2} | {} |",
            p.what,
            p.floor,
            p.floor_median.as_secs_f64() * 1e6,
            p.subject_median.as_secs_f64() * 1e6,
            p.subject_median.as_secs_f64() / p.floor_median.as_secs_f64(),
            p.target
        );
    }
    println!("{table}");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/results");
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(format!("{dir}/ratios.md"), table).expect("write ratios.md");
}
