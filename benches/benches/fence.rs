//! What a fenced write costs: on one redis-server (loopback), `SET`,
//! `HSET` and `INCRBY` against the same write through `RedisFence` (one
//! script that checks the token, writes and records it), interleaved round
//! by round so machine noise hits both alike; and the in-process fence's
//! write against a plain mutex-guarded map insert; on one PostgreSQL
//! (loopback), a transaction `BEGIN; upsert; COMMIT` against the same with
//! `PgFence::admit` first.
//! `cargo bench -p distlock-benches --bench fence`;
//! `DISTLOCK_BENCH_ROUNDS` sets the rounds (default 3000). Writes
//! `results/fence.md`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use distlock::fence::postgres::{tokio_postgres, PgFence};
use distlock::fence::{Fence, FenceToken, MemFence};
use distlock::redis::redis;
use distlock::redis::{RedisFence, RedisProvider};
use test_support::RedisServer;

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
    let server = RedisServer::start();
    let url = server.url();
    let mut rows = rt.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let provider = RedisProvider::connect(&url).await.expect("redis");
        let fence = RedisFence::new(&provider);
        let mut t = vec![Vec::new(); 6];
        for round in 0..rounds {
            // A new holder every round, as under a lock handed on.
            let token = FenceToken::exclusive(u64::try_from(round).unwrap_or(0) + 1);
            let c = &mut conn;
            t[0].push(
                time(async {
                    let () = redis::cmd("SET")
                        .arg("bench/raw")
                        .arg("v")
                        .query_async(c)
                        .await
                        .expect("set");
                })
                .await,
            );
            t[1].push(
                time(async {
                    fence
                        .set("bench/fenced", "v", token)
                        .await
                        .expect("fenced set");
                })
                .await,
            );
            let c = &mut conn;
            t[2].push(
                time(async {
                    let _: i64 = redis::cmd("HSET")
                        .arg("bench/raw-h")
                        .arg("f")
                        .arg("v")
                        .query_async(c)
                        .await
                        .expect("hset");
                })
                .await,
            );
            t[3].push(
                time(async {
                    fence
                        .hset("bench/fenced-h", "f", "v", token)
                        .await
                        .expect("fenced hset");
                })
                .await,
            );
            let c = &mut conn;
            t[4].push(
                time(async {
                    let _: i64 = redis::cmd("INCRBY")
                        .arg("bench/raw-n")
                        .arg(1)
                        .query_async(c)
                        .await
                        .expect("incrby");
                })
                .await,
            );
            t[5].push(
                time(async {
                    fence
                        .incr("bench/fenced-n", 1, token)
                        .await
                        .expect("fenced incr");
                })
                .await,
            );
        }
        let mut t = t.into_iter().map(median);
        let mut rows = Vec::new();
        for what in ["SET", "HSET", "INCRBY"] {
            let raw = t.next().expect("raw");
            let fenced = t.next().expect("fenced");
            rows.push((format!("Redis {what}"), raw, fenced));
        }
        rows
    });
    // PostgreSQL: the user's transaction, unfenced and fenced.
    let pg = test_support::postgres::PostgresServer::start();
    rows.push(rt.block_on(async {
        let (mut db, conn) = tokio_postgres::connect(&pg.conn_str(), tokio_postgres::NoTls)
            .await
            .expect("postgres");
        tokio::spawn(conn);
        let fence = PgFence::new();
        fence.migrate(&db).await.expect("migrate");
        db.batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_values (k text PRIMARY KEY, v bigint NOT NULL)",
        )
        .await
        .expect("table");
        let upsert = db
            .prepare("INSERT INTO bench_values VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v")
            .await
            .expect("prepare");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let v = i64::try_from(round).unwrap_or(0) + 1;
            let start = Instant::now();
            let tx = db.transaction().await.expect("begin");
            tx.execute(&upsert, &[&"bench/raw", &v]).await.expect("upsert");
            tx.commit().await.expect("commit");
            a.push(start.elapsed());
            let start = Instant::now();
            let mut tx = db.transaction().await.expect("begin");
            fence
                .admit(&mut tx, "bench/fenced", FenceToken::exclusive(v.unsigned_abs()))
                .await
                .expect("admit");
            tx.execute(&upsert, &[&"bench/fenced", &v]).await.expect("upsert");
            tx.commit().await.expect("commit");
            b.push(start.elapsed());
        }
        (
            "PostgreSQL transaction (BEGIN; upsert; COMMIT)".to_owned(),
            median(a),
            median(b),
        )
    }));
    // In process: the closure's write under the fence against the same
    // insert under a plain mutex (no I/O: the check's own cost).
    let plain: Mutex<HashMap<String, u64>> = Mutex::new(HashMap::new());
    let fenced: MemFence<u64> = MemFence::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds * 10 {
        let v = u64::try_from(round).unwrap_or(0) + 1;
        let start = Instant::now();
        plain.lock().expect("map").insert("bench/mem".to_owned(), v);
        a.push(start.elapsed());
        let start = Instant::now();
        fenced
            .write("bench/mem", FenceToken::exclusive(v), |x| *x = Some(v))
            .expect("fenced write");
        b.push(start.elapsed());
    }
    rows.push(("in-process write".to_owned(), median(a), median(b)));
    let mut table = String::from(
        "| write (loopback server) | unfenced median (µs) | fenced median (µs) | fenced ÷ unfenced |\n|---|---:|---:|---:|\n",
    );
    for (what, raw, fenced) in &rows {
        let _ = writeln!(
            table,
            "| {what} | {:.2} | {:.2} | {:.2} |",
            raw.as_secs_f64() * 1e6,
            fenced.as_secs_f64() * 1e6,
            fenced.as_secs_f64() / raw.as_secs_f64(),
        );
    }
    println!("{table}");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/results");
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(format!("{dir}/fence.md"), table).expect("write fence.md");
}
