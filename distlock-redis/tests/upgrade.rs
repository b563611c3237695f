//! A rolling upgrade on one server: clients of the previous distlock version
//! (its acquire and release scripts, kept unchanged in
//! `tests/fixtures/previous/`, run with that version's keys and arguments)
//! and of this version contend for one lock at once. Never two holders, and
//! every fencing token above the one before, whichever version took it.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::Provider;
use distlock_redis::{RedisOptions, RedisProvider};
use redis::Script;
use test_support::unique_name;

const PREVIOUS_ACQUIRE: &str = include_str!("fixtures/previous/acquire.lua");
const PREVIOUS_RELEASE: &str = concat!(
    include_str!("fixtures/previous/line_pop.lua"),
    include_str!("fixtures/previous/mutex_release.lua")
);

/// Who holds the lock now (in this process's view) and the last token.
struct Referee {
    holding: AtomicBool,
    last: Mutex<u64>,
    overlaps: AtomicUsize,
    regressions: AtomicUsize,
}

impl Referee {
    fn enter(&self, token: u64, who: &str) {
        if self.holding.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
            eprintln!("overlap: {who} got in while another held");
        }
        let mut last = self.last.lock().unwrap();
        if token <= *last {
            self.regressions.fetch_add(1, Ordering::SeqCst);
            eprintln!("token {token} of {who} after {}", *last);
        }
        *last = token;
    }

    fn leave(&self) {
        self.holding.store(false, Ordering::SeqCst);
    }
}

/// One client of the previous version: its acquire (waiting in the line,
/// as its `lock()` did) and release scripts with that version's keys, in a
/// loop of short retries, until `until`.
async fn previous_client(
    url: String,
    key: String,
    id: String,
    referee: Arc<Referee>,
    until: Instant,
    count: Arc<AtomicU64>,
) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let acquire = Script::new(PREVIOUS_ACQUIRE);
    let release = Script::new(PREVIOUS_RELEASE);
    let mut queued = false;
    while Instant::now() < until {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (status, value, _): (i64, i64, i64) = acquire
            .key(&key)
            .key(format!("{{{key}}}:fence"))
            .key(format!("{{{key}}}:holder"))
            .key(format!("{{{key}}}:waiting"))
            .key(format!("{{{key}}}:handoff"))
            .key(format!("{{{key}}}:waiting:alive"))
            .arg(&token)
            .arg(30_000)
            .arg("previous@test")
            .arg(&id)
            .arg("1")
            .arg("0")
            .arg(if queued { "1" } else { "0" })
            .arg(1_000)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        match status {
            1 => {
                queued = false;
                referee.enter(u64::try_from(value).unwrap(), "previous");
                tokio::time::sleep(Duration::from_micros(300)).await;
                referee.leave();
                let released: i64 = release
                    .key(&key)
                    .key(format!("{{{key}}}:fair:queue"))
                    .key(format!("{{{key}}}:fair:timeouts"))
                    .key(format!("{{{key}}}:holder"))
                    .key(format!("{{{key}}}:fair:owners"))
                    .key(format!("{{{key}}}:waiting"))
                    .key(format!("{{{key}}}:handoff"))
                    .key(format!("{{{key}}}:waiting:alive"))
                    .arg(&token)
                    .arg(format!("{{{key}}}:released"))
                    .arg(50)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(released, 1, "the previous version's release");
                count.fetch_add(1, Ordering::Relaxed);
            }
            0 => {
                queued = true;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            other => panic!("previous acquire: {other}"),
        }
    }
    // Out of the line, as the previous version's leave did.
    let _: () = redis::cmd("ZREM")
        .arg(format!("{{{key}}}:waiting"))
        .arg(&id)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_and_this_version_on_one_lock_never_overlap_and_tokens_increase() {
    let redis = test_support::redis::shared();
    let name = unique_name("upgrade");
    let options = RedisOptions::new().recheck_interval(Duration::from_millis(100));
    let mut providers = Vec::new();
    for _ in 0..2 {
        providers.push(Arc::new(
            RedisProvider::connect_with(&redis.url(), options.clone())
                .await
                .unwrap(),
        ));
    }
    let key = providers[0].lock_key(&name).unwrap();
    let referee = Arc::new(Referee {
        holding: AtomicBool::new(false),
        last: Mutex::new(0),
        overlaps: AtomicUsize::new(0),
        regressions: AtomicUsize::new(0),
    });
    let until = Instant::now() + Duration::from_secs(4);
    let previous = Arc::new(AtomicU64::new(0));
    let this = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push(tokio::spawn(previous_client(
            redis.url(),
            key.clone(),
            format!("previous-{i}"),
            Arc::clone(&referee),
            until,
            Arc::clone(&previous),
        )));
    }
    for provider in &providers {
        for _ in 0..2 {
            let lock = provider.mutex(&name).unwrap();
            let referee = Arc::clone(&referee);
            let this = Arc::clone(&this);
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let Some(guard) = lock.lock_timeout(Duration::from_secs(2)).await.unwrap()
                    else {
                        continue;
                    };
                    referee.enter(guard.fencing_token(), "this");
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    referee.leave();
                    guard.release().await.unwrap();
                    this.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (previous, this) = (
        previous.load(Ordering::Relaxed),
        this.load(Ordering::Relaxed),
    );
    println!("acquisitions: previous version {previous}, this version {this}");
    assert_eq!(
        referee.overlaps.load(Ordering::SeqCst),
        0,
        "two holders at once"
    );
    assert_eq!(
        referee.regressions.load(Ordering::SeqCst),
        0,
        "a token went back"
    );
    assert!(previous > 0 && this > 0, "previous {previous}, this {this}");
    for provider in providers {
        Arc::try_unwrap(provider).unwrap().close().await.unwrap();
    }
}
