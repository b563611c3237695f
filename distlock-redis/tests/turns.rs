//! Nobody starves on a contended plain mutex: clients outside distlock's
//! line — redis-py polling with `SET NX`, or processes of an earlier
//! distlock version with their own line rules — get turns while distlock
//! processes contend, and the lock passes between the groups at least a
//! fifth of the time.
//!
//! Every client runs in a process of its own: this test binary, started
//! again as a worker (the ignored `worker` test, driven by environment
//! variables), redis-py in `python3`, and the earlier version's scripts
//! driven from the test process. Each holder appends its name and token to
//! a list while it holds, so the list is the order of the holds (mutual
//! exclusion orders them), counted without timing anything; a counter
//! incremented on entry and decremented before the release catches two
//! holders at once.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use distlock_core::Provider;
use distlock_redis::RedisProvider;
use redis::{AsyncCommands, Script};
use test_support::unique_name;

/// The acquire and release scripts of the earlier version (commit
/// b1cdfc2), unchanged: its line has no liveness entries and its
/// reservation is `{lock}:handoff`.
const EARLIER_ACQUIRE: &str = include_str!("fixtures/b1cdfc2/acquire.lua");
const EARLIER_RELEASE: &str = include_str!("fixtures/b1cdfc2/mutex_release.lua");

/// Acquisitions each distlock worker makes.
const PER_WORKER: usize = 200;

/// How long each holder holds.
const HOLD: Duration = Duration::from_micros(500);

/// A redis-py client polling every millisecond (`Lock.acquire` with
/// `sleep=0.001`, and a millisecond after each hold), holding for 0.5 ms,
/// until the stop key appears.
const POLLER: &str = r#"
import sys, time, redis
url, key, log, holders, ready, stop, label = sys.argv[1:8]
r = redis.Redis.from_url(url)
r.incr(ready)
while not r.exists(stop):
    lock = r.lock(key, timeout=10, sleep=0.001)
    if not lock.acquire(blocking=True, blocking_timeout=0.2):
        continue
    if r.incr(holders) != 1:
        r.rpush(log + ":overlaps", label)
    r.rpush(log, label + ":0")
    time.sleep(0.0005)
    r.decr(holders)
    lock.release()
    time.sleep(0.001)
"#;

/// The test-side keys of one run.
struct Run {
    url: String,
    name: String,
    key: String,
    log: String,
    holders: String,
    ready: String,
    stop: String,
}

impl Run {
    async fn new(test: &str) -> Run {
        let redis = test_support::redis::shared();
        let url = redis.url();
        let name = unique_name(test);
        let provider = RedisProvider::connect(&url).await.unwrap();
        let key = provider.lock_key(&name).unwrap();
        provider.close().await.unwrap();
        let base = format!("test:{name}");
        Run {
            url,
            name,
            key,
            log: format!("{base}:log"),
            holders: format!("{base}:holders"),
            ready: format!("{base}:ready"),
            stop: format!("{base}:stop"),
        }
    }

    /// A distlock worker process: `PER_WORKER` acquisitions as `label`.
    fn worker(&self, label: &str) -> Child {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "worker", "--ignored", "--nocapture"])
            .env("TURNS_URL", &self.url)
            .env("TURNS_NAME", &self.name)
            .env("TURNS_LOG", &self.log)
            .env("TURNS_HOLDERS", &self.holders)
            .env("TURNS_LABEL", label)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    fn poller(&self, label: &str) -> Child {
        Command::new("python3")
            .args(["-c", POLLER])
            .args([
                &self.url,
                &self.key,
                &self.log,
                &self.holders,
                &self.ready,
                &self.stop,
                label,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs (scripts/install-servers.sh installs redis-py)")
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The holds in order, as (label, token).
    async fn holds(&self) -> Vec<(String, u64)> {
        let mut conn = self.conn().await;
        let log: Vec<String> = conn.lrange(&self.log, 0, -1).await.unwrap();
        let overlaps: Vec<String> = conn
            .lrange(format!("{}:overlaps", self.log), 0, -1)
            .await
            .unwrap();
        assert!(overlaps.is_empty(), "two holders at once: {overlaps:?}");
        log.iter()
            .map(|entry| {
                let (label, token) = entry.rsplit_once(':').unwrap();
                (label.to_owned(), token.parse().unwrap())
            })
            .collect()
    }
}

/// Waits for a child, failing the test if it failed.
fn finish(mut child: Child, what: &str) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{what} exited with {status}");
}

/// Checks the order of holds while the distlock workers ran (from their
/// first hold to their last): every `others` label held at least `each` times,
/// and the lock passed between distlock and the others in at least a fifth
/// of those holds. Returns the passes and the holds counted.
fn assert_turns(holds: &[(String, u64)], others: &[&str], each: usize) -> (usize, usize) {
    let is_distlock = |label: &str| label.starts_with("distlock");
    let first = holds
        .iter()
        .position(|(label, _)| is_distlock(label))
        .expect("distlock held");
    let last = holds
        .iter()
        .rposition(|(label, _)| is_distlock(label))
        .expect("distlock held");
    let window = &holds[first..=last];
    if std::env::var("TURNS_DEBUG").is_ok() {
        let mut runs = String::new();
        let mut prev = "";
        let mut n = 0;
        for (label, _) in window {
            if label != prev {
                if n > 0 {
                    runs.push_str(&format!("{prev}x{n} "));
                }
                prev = label;
                n = 0;
            }
            n += 1;
        }
        println!("{runs}");
    }
    let passes = window
        .windows(2)
        .filter(|w| is_distlock(&w[0].0) != is_distlock(&w[1].0))
        .count();
    let counts: Vec<(&str, usize)> = others
        .iter()
        .map(|o| (*o, window.iter().filter(|(l, _)| l == o).count()))
        .collect();
    println!(
        "{} holds while distlock contended, {passes} passes between the groups, others {counts:?}",
        window.len()
    );
    for (label, count) in &counts {
        assert!(
            *count >= each,
            "{label} held {count} times while distlock contended ({} holds): starved",
            window.len()
        );
    }
    assert!(
        passes * 5 >= window.len(),
        "the lock passed between the groups {passes} times in {} holds (less than a fifth)",
        window.len()
    );
    (passes, window.len())
}

/// Run as a separate process by the tests below (driven by `TURNS_*`
/// environment variables): `PER_WORKER` acquisitions of the mutex, each
/// logged with its token while held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the tests in this file"]
async fn worker() {
    let var = |v: &str| std::env::var(v).unwrap();
    let provider = RedisProvider::connect(&var("TURNS_URL")).await.unwrap();
    let mut conn = redis::Client::open(var("TURNS_URL"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (log, holders, label) = (var("TURNS_LOG"), var("TURNS_HOLDERS"), var("TURNS_LABEL"));
    let lock = provider.mutex(&var("TURNS_NAME")).unwrap();
    for _ in 0..PER_WORKER {
        let guard = lock
            .lock_timeout(Duration::from_secs(30))
            .await
            .unwrap()
            .expect("the lock within 30 s");
        let entered: i64 = conn.incr(&holders, 1).await.unwrap();
        if entered != 1 {
            let _: () = conn.rpush(format!("{log}:overlaps"), &label).await.unwrap();
        }
        let _: () = conn
            .rpush(&log, format!("{label}:{}", guard.fencing_token()))
            .await
            .unwrap();
        tokio::time::sleep(HOLD).await;
        let _: () = conn.decr(&holders, 1).await.unwrap();
        guard.release().await.unwrap();
    }
    provider.close().await.unwrap();
}

/// 2 redis-py pollers and 2 distlock worker processes on one name.
async fn redis_py_beside_distlock() {
    let run = Run::new("turns-py").await;
    let mut conn = run.conn().await;
    let pollers = [run.poller("py-0"), run.poller("py-1")];
    // Both pollers poll before distlock starts.
    let deadline = tokio::time::Instant::now() + test_support::PEER_START;
    loop {
        let ready: Option<u64> = conn.get(&run.ready).await.unwrap();
        if ready == Some(2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "redis-py did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let workers = [run.worker("distlock-0"), run.worker("distlock-1")];
    for worker in workers {
        finish(worker, "a distlock worker");
    }
    let _: () = conn.set(&run.stop, 1).await.unwrap();
    for poller in pollers {
        finish(poller, "a redis-py poller");
    }
    let holds = run.holds().await;
    let distlock = holds
        .iter()
        .filter(|(l, _)| l.starts_with("distlock"))
        .count();
    assert_eq!(distlock, 2 * PER_WORKER);
    // Each poller: at least a twentieth of distlock's acquisitions.
    assert_turns(&holds, &["py-0", "py-1"], 2 * PER_WORKER / 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_pollers_get_turns_while_distlock_processes_contend() {
    redis_py_beside_distlock().await;
}

/// One client of the earlier version (b1cdfc2's scripts with its keys and
/// arguments): it waits in that version's line and retries every
/// millisecond while refused (that version's waiters wake on every
/// release message and every change of the key; this polls instead), until
/// the stop key appears. Every hold is logged with its token.
async fn earlier_client(
    url: String,
    key: String,
    log: String,
    holders: String,
    stop: String,
    id: String,
) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let acquire = Script::new(EARLIER_ACQUIRE);
    let release = Script::new(EARLIER_RELEASE);
    let mut queued = false;
    loop {
        let stopped: bool = conn.exists(&stop).await.unwrap();
        if stopped {
            break;
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (status, value, _): (i64, i64, i64) = acquire
            .key(&key)
            .key(format!("{{{key}}}:fence"))
            .key(format!("{{{key}}}:holder"))
            .key(format!("{{{key}}}:waiting"))
            .key(format!("{{{key}}}:handoff"))
            .arg(&token)
            .arg(30_000)
            .arg("earlier@test")
            .arg(&id)
            .arg("1")
            .arg("0")
            .arg(if queued { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .unwrap();
        match status {
            1 => {
                queued = false;
                let entered: i64 = conn.incr(&holders, 1).await.unwrap();
                if entered != 1 {
                    let _: () = conn.rpush(format!("{log}:overlaps"), &id).await.unwrap();
                }
                let _: () = conn.rpush(&log, format!("{id}:{value}")).await.unwrap();
                tokio::time::sleep(HOLD).await;
                let _: () = conn.decr(&holders, 1).await.unwrap();
                let released: i64 = release
                    .key(&key)
                    .key(format!("{{{key}}}:fair:queue"))
                    .key(format!("{{{key}}}:fair:timeouts"))
                    .key(format!("{{{key}}}:holder"))
                    .key(format!("{{{key}}}:fair:owners"))
                    .key(format!("{{{key}}}:waiting"))
                    .key(format!("{{{key}}}:handoff"))
                    .arg(&token)
                    .arg(format!("{{{key}}}:released"))
                    .arg(50)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(released, 1, "the earlier version's release");
            }
            0 => {
                queued = true;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            other => panic!("earlier acquire: {other}"),
        }
    }
    // Out of the line, as that version's leave did.
    let _: () = conn.zrem(format!("{{{key}}}:waiting"), &id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_version_clients_get_turns_while_this_version_contends() {
    let run = Run::new("turns-upgrade").await;
    let mut conn = run.conn().await;
    let earlier: Vec<_> = ["earlier-0", "earlier-1"]
        .into_iter()
        .map(|id| {
            tokio::spawn(earlier_client(
                run.url.clone(),
                run.key.clone(),
                run.log.clone(),
                run.holders.clone(),
                run.stop.clone(),
                id.to_owned(),
            ))
        })
        .collect();
    let workers = [run.worker("distlock-0"), run.worker("distlock-1")];
    let workers = tokio::task::spawn_blocking(move || {
        for worker in workers {
            finish(worker, "a distlock worker");
        }
    });
    workers.await.unwrap();
    let _: () = conn.set(&run.stop, 1).await.unwrap();
    for task in earlier {
        task.await.unwrap();
    }
    let holds = run.holds().await;
    for pair in holds.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "a token went back: {:?} after {:?}",
            pair[1],
            pair[0]
        );
    }
    assert_turns(&holds, &["earlier-0", "earlier-1"], 2 * PER_WORKER / 20);
}
