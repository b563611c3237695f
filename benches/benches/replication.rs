//! What replica acknowledgement (`wait_replicas`) costs: on one master with
//! one replica (loopback), the uncontended lock+release of the plain mutex
//! and of the mutex with `WAIT 1`, interleaved round by round so machine
//! noise hits both alike, with the raw floors (`SET NX PX` + compare-and-
//! delete, and the same with `WAIT 1` pipelined behind the `SET`).
//! `cargo bench -p distlock-benches --bench replication`;
//! `DISTLOCK_BENCH_ROUNDS` sets the rounds (default 3000). Writes
//! `results/replication.md`.

use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

use distlock::redis::redis;
use distlock::redis::{RedisOptions, RedisProvider};
use distlock::Provider;
use test_support::replicas::Replicated;

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
    let set = Replicated::start(1);
    let url = set.master().url();
    let rows = rt.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let release = redis::Script::new(RELEASE_LUA);
        let plain = RedisProvider::connect(&url).await.expect("redis");
        let acked = RedisProvider::connect_with(
            &url,
            RedisOptions::new().wait_for_replicas(1, Duration::from_millis(250)),
        )
        .await
        .expect("redis");
        let plain_mutex = plain.mutex("bench/plain").expect("name");
        let acked_mutex = acked.mutex("bench/acked").expect("name");
        let (mut raw, mut raw_wait, mut ours, mut ours_wait) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let c = &mut conn;
            raw.push(
                time(async {
                    let _: Option<String> = redis::cmd("SET")
                        .arg("bench/raw")
                        .arg("token")
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(c)
                        .await
                        .expect("set");
                    let _: i64 = release
                        .key("bench/raw")
                        .arg("token")
                        .invoke_async(c)
                        .await
                        .expect("del");
                })
                .await,
            );
            let c = &mut conn;
            raw_wait.push(
                time(async {
                    let (_, acked): (Option<String>, i64) = redis::pipe()
                        .cmd("SET")
                        .arg("bench/raw-wait")
                        .arg("token")
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .cmd("WAIT")
                        .arg(1)
                        .arg(250)
                        .query_async(c)
                        .await
                        .expect("set + wait");
                    assert_eq!(acked, 1, "the replica did not acknowledge");
                    let _: i64 = release
                        .key("bench/raw-wait")
                        .arg("token")
                        .invoke_async(c)
                        .await
                        .expect("del");
                })
                .await,
            );
            ours.push(
                time(async {
                    let g = plain_mutex.lock().await.expect("lock");
                    g.release().await.expect("release");
                })
                .await,
            );
            ours_wait.push(
                time(async {
                    let g = acked_mutex.lock().await.expect("lock with WAIT 1");
                    g.release().await.expect("release");
                })
                .await,
            );
        }
        let plain_median = median(ours);
        vec![
            (
                "raw SET NX PX + compare-and-delete",
                median(raw),
                plain_median,
            ),
            (
                "raw SET NX PX + WAIT 1 (pipelined) + compare-and-delete",
                median(raw_wait),
                plain_median,
            ),
            ("distlock mutex lock+release", plain_median, plain_median),
            (
                "distlock mutex lock+release, wait_replicas=1",
                median(ours_wait),
                plain_median,
            ),
        ]
    });
    let mut table = String::from(
        "| measured (1 master + 1 replica, loopback) | median (µs) | ÷ distlock mutex without WAIT |\n|---|---:|---:|\n",
    );
    for (what, subject, base) in &rows {
        let _ = writeln!(
            table,
            "| {what} | {:.1} | {:.2} |",
            subject.as_secs_f64() * 1e6,
            subject.as_secs_f64() / base.as_secs_f64(),
        );
    }
    println!("{table}");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/results");
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(format!("{dir}/replication.md"), table).expect("write replication.md");
}
