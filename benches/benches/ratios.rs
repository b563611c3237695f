//! The performance targets of DESIGN.md as ratios, measured interleaved:
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
        let (mut floor, mut ours, mut peer, mut ping) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
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
        pairs.push(Pair {
            what: "redis/mutex lock+release",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "≤ 1.2",
            floor_median,
            subject_median: median(ours),
        });
        pairs.push(Pair {
            what: "rslock lock+unlock (peer)",
            floor: "raw SET NX PX + EVALSHA compare-and-delete",
            target: "-",
            floor_median,
            subject_median: median(peer),
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
        let (mut floor, mut fair_t, mut unfair_t) = (Vec::new(), Vec::new(), Vec::new());
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
        pairs.push(Pair {
            what: "zk/fair_mutex lock+release",
            floor: "raw create (ephemeral sequential) + delete",
            target: "≤ 1.3",
            floor_median,
            subject_median: median(fair_t),
        });
        pairs.push(Pair {
            what: "zk/unfair_mutex lock+release",
            floor: "raw create (ephemeral sequential) + delete",
            target: "-",
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
