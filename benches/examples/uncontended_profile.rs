//! Where the time of an uncontended Redis lock+release goes: the same loop
//! run raw (SET NX PX + EVALSHA compare-and-delete, the floor of
//! `--bench ratios`) and through distlock, one after the other on a private
//! Redis, with the server's own time per call (`INFO commandstats`) for
//! each. Run it under `perf stat -e context-switches,task-clock` (one mode
//! at a time: `DISTLOCK_PROFILE_MODE=raw` or `=distlock`) to see the
//! client's share.
//!
//! ```sh
//! cargo run --release -p distlock-benches --example uncontended_profile
//! DISTLOCK_PROFILE_MODE=distlock perf stat -e context-switches,task-clock \
//!     target/release/examples/uncontended_profile
//! ```

use std::time::Instant;

use distlock::redis::{redis, RedisProvider};
use distlock::Provider;
use test_support::RedisServer;

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Calls and microseconds per call of `command` in `INFO commandstats`.
fn server_time(redis: &RedisServer, command: &str) -> (u64, f64) {
    let stats = redis.cli(&["INFO", "commandstats"]);
    let Some(line) = stats
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
    else {
        return (0, 0.0);
    };
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (field("calls=") as u64, field("usec_per_call="))
}

fn main() {
    let rounds: u32 = std::env::var("DISTLOCK_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let only = std::env::var("DISTLOCK_PROFILE_MODE").ok();
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = redis::Client::open(redis.url()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let release = redis::Script::new(RELEASE_LUA);
        let locks = RedisProvider::connect(&redis.url()).await.expect("redis");
        let mutex = locks.mutex("profile/distlock").expect("name");
        for mode in ["raw", "distlock"] {
            if only.as_deref().is_some_and(|m| m != mode) {
                continue;
            }
            // Warm up (scripts loaded, connections open), then count.
            for i in 0..500u32 {
                if mode == "raw" {
                    raw_round(&mut conn, &release, i).await;
                } else {
                    mutex.lock().await.expect("lock").release().await.expect("release");
                }
            }
            let _ = redis.cli(&["CONFIG", "RESETSTAT"]);
            let started = Instant::now();
            for i in 0..rounds {
                if mode == "raw" {
                    raw_round(&mut conn, &release, i).await;
                } else {
                    mutex.lock().await.expect("lock").release().await.expect("release");
                }
            }
            let per_op = started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
            let (set_calls, set_us) = server_time(&redis, "set");
            let (eval_calls, eval_us) = server_time(&redis, "evalsha");
            println!(
                "{mode:>8}: {per_op:.1} µs per lock+release; server: SET {set_calls} calls x {set_us:.2} µs, EVALSHA {eval_calls} calls x {eval_us:.2} µs"
            );
        }
    });
}

async fn raw_round(conn: &mut redis::aio::MultiplexedConnection, release: &redis::Script, i: u32) {
    let token = format!("t{i}");
    let _: Option<String> = redis::cmd("SET")
        .arg("profile/raw")
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .expect("set");
    let _: i64 = release
        .key("profile/raw")
        .arg(&token)
        .invoke_async(conn)
        .await
        .expect("release");
}
