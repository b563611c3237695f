//! Redis-specific behaviour against real redis-server processes: waiting by
//! pub/sub, one subscriber per provider, cancelled waits, wrong-type keys,
//! server faults, persistence of fencing tokens, redis-py interop, ACL users,
//! id generation.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseOptions, LostReason, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::conformance::eventually_locks;
use test_support::{free_port, unique_name, RedisServer};

const SLACK: Duration = Duration::from_secs(3);

async fn connect(url: &str, options: RedisOptions) -> RedisProvider {
    RedisProvider::connect_with(url, options)
        .await
        .expect("connect to the test redis-server")
}

fn long() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(60)).unwrap()
}

fn count_lines(s: &str) -> usize {
    s.lines().filter(|l| !l.trim().is_empty()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_by_message_not_by_polling() {
    let url = test_support::redis::shared().url();
    // A re-check interval far longer than the test: only the message can wake.
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let holder = connect(&url, RedisOptions::new()).await;
    let waiter = connect(&url, slow).await;
    let name = unique_name("wake");
    let guard = holder
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let lock = waiter.with_lease(long()).unwrap().mutex(&name).unwrap();
    let task = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (acquired, g) = tokio::time::timeout(SLACK, task).await.unwrap().unwrap();
    assert!(acquired.duration_since(released) < Duration::from_secs(1));
    assert!(waiter.wakeups() >= 1, "no release message was delivered");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_subscriber_connection() {
    let redis = RedisServer::start();
    let holder = connect(&redis.url(), RedisOptions::new()).await;
    let waiter = connect(&redis.url(), RedisOptions::new()).await;
    let names: Vec<String> = (0..50).map(|i| unique_name(&format!("many{i}"))).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            holder
                .with_lease(long())
                .unwrap()
                .mutex(n)
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    let mut tasks = Vec::new();
    for n in &names {
        let lock = waiter.with_lease(long()).unwrap().mutex(n).unwrap();
        tasks.push(tokio::spawn(async move { lock.lock().await.unwrap() }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(waiter.subscriber_connections(), 1);
    assert_eq!(
        count_lines(&redis.cli(&["CLIENT", "LIST", "TYPE", "pubsub"])),
        1,
        "one pub/sub connection for 50 waiters"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    for t in tasks {
        let g = tokio::time::timeout(SLACK, t).await.unwrap().unwrap();
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_cancelled_waits_leave_no_client_and_no_subscription() {
    let redis = RedisServer::start();
    let holder = connect(&redis.url(), RedisOptions::new()).await;
    let waiter = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("cancelled");
    let guard = holder
        .with_lease(long())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let lock = waiter.with_lease(long()).unwrap().mutex(&name).unwrap();
    let before = count_lines(&redis.cli(&["CLIENT", "LIST"]));
    let mut rng = fastrand_like(7);
    for _ in 0..1000 {
        let cut = Duration::from_micros(rng() % 2000);
        assert!(tokio::time::timeout(cut, lock.lock()).await.is_err());
    }
    let channel = format!("{{{}}}:released", waiter.lock_key(&name).unwrap());
    // The channel lingers 2 s after its last waiter, then goes.
    let deadline = Instant::now() + SLACK + Duration::from_secs(2);
    loop {
        let subs = redis.cli(&["PUBSUB", "NUMSUB", &channel]);
        let clients = count_lines(&redis.cli(&["CLIENT", "LIST"]));
        // The shared subscriber stays open (one connection) once used.
        if subs.lines().nth(1) == Some("0") && clients <= before + 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 1000 cancelled waits: {clients} clients (before {before}), NUMSUB {subs:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(waiter.subscriber_connections(), 1);
    // Nothing of the waiter is left holding: the lock is the holder's alone.
    guard.release().await.unwrap();
    let g = lock.try_lock().await.unwrap().expect("free after release");
    g.release().await.unwrap();
}

/// A tiny deterministic generator, so the test needs no extra crate.
fn fastrand_like(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_another_type_are_conflicts_and_stay_untouched() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url(), RedisOptions::new()).await;

    let name = unique_name("hash");
    let key = locks.lock_key(&name).unwrap();
    let _ = redis.cli(&["HSET", &key, "owner", "someone-else"]);
    let r = locks.mutex(&name).unwrap().try_lock().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    let r = locks
        .mutex(&name)
        .unwrap()
        .lock_timeout(Duration::from_millis(100))
        .await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(redis.cli(&["TYPE", &key]), "hash");
    assert_eq!(redis.cli(&["HGET", &key, "owner"]), "someone-else");

    let name = unique_name("fence");
    let key = locks.lock_key(&name).unwrap();
    let fence = format!("{{{key}}}:fence");
    let _ = redis.cli(&["SET", &fence, "not-a-number"]);
    let r = locks.mutex(&name).unwrap().try_lock().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(redis.cli(&["EXISTS", &key]), "0", "lock key left behind");
    assert_eq!(redis.cli(&["GET", &fence]), "not-a-number");

    let name = unique_name("ids");
    let ids_key = format!("{{{}}}:ids", locks.lock_key(&name).unwrap());
    let _ = redis.cli(&["LPUSH", &ids_key, "x"]);
    let r = locks.id_generator(&name, 1).unwrap().next().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(redis.cli(&["LLEN", &ids_key]), "1");

    let name = unique_name("ids-full");
    let ids_key = format!("{{{}}}:ids", locks.lock_key(&name).unwrap());
    let _ = redis.cli(&["SET", &ids_key, &i64::MAX.to_string()]);
    let r = locks.id_generator(&name, 1).unwrap().next().await;
    assert!(matches!(r, Err(Error::Exhausted { .. })), "{r:?}");
    assert_eq!(redis.cli(&["GET", &ids_key]), i64::MAX.to_string());
}

#[tokio::test]
async fn no_server_at_connect_is_a_typed_error_within_the_timeout() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    for options in [RedisOptions::new(), RedisOptions::new().pool_size(2)] {
        let start = Instant::now();
        let r = RedisProvider::connect_with(&url, options.connect_timeout(Duration::from_secs(1)))
            .await;
        let e = r.expect_err("connected to nothing");
        assert!(e.is_retryable(), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(1) + SLACK);
    }
    assert!(matches!(
        RedisProvider::connect("redis://127.0.0.1:notaport").await,
        Err(Error::InvalidUrl(_))
    ));
    assert!(matches!(
        RedisProvider::connect_with("redis://127.0.0.1:1", RedisOptions::new().key_prefix("{x}"))
            .await,
        Err(Error::InvalidOptions(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_gives_timeouts_not_hangs() {
    let redis = RedisServer::start();
    let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
    let locks = connect(&redis.url(), options).await;
    let lock = locks.mutex(&unique_name("paused")).unwrap();
    redis.pause();
    let start = Instant::now();
    let r = lock.try_lock().await;
    let took = start.elapsed();
    redis.resume();
    let e = r.expect_err("a frozen server answered");
    assert!(e.is_retryable(), "{e:?}");
    assert!(took < Duration::from_millis(300) + SLACK, "{took:?}");
    // The cancelled attempt's cleanup and the next attempt both go through.
    let g = eventually_locks(lock.as_ref(), SLACK * 2, "the resumed server").await;
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_lease_fires_lost_and_the_provider_recovers() {
    let mut redis = RedisServer::start();
    let options = RedisOptions::new().response_timeout(Duration::from_millis(300));
    let locks = connect(&redis.url(), options).await;
    let lease = LeaseOptions::new(Duration::from_secs(1)).unwrap();
    let lock = locks
        .with_lease(lease)
        .unwrap()
        .mutex(&unique_name("killed"))
        .unwrap();
    let guard = lock.lock().await.unwrap();
    redis.kill();
    let reason = tokio::time::timeout(Duration::from_secs(1) + SLACK, guard.lost())
        .await
        .expect("lost() did not fire after the server died");
    assert_eq!(reason, LostReason::Expired);
    assert!(!guard.is_held());
    let late = guard.release().await;
    assert!(late.is_err(), "release against a dead server: {late:?}");
    redis.restart();
    // The same provider, not rebuilt, acquires again once the server is back.
    let g = eventually_locks(lock.as_ref(), SLACK * 3, "the provider").await;
    g.release().await.unwrap();
}

async fn tokens_across_restart(mut redis: RedisServer) -> (u64, u64) {
    let name = unique_name("persist");
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let lock = locks.mutex(&name).unwrap();
    let mut before = 0;
    for _ in 0..3 {
        let g = lock.lock().await.unwrap();
        before = g.fencing_token();
        g.release().await.unwrap();
    }
    redis.kill();
    redis.restart();
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let g = locks.mutex(&name).unwrap().lock().await.unwrap();
    let after = g.fencing_token();
    g.release().await.unwrap();
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_a_crash_with_or_without_persistence() {
    let persistent = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let (before, after) = tokens_across_restart(persistent).await;
    assert!(
        after > before,
        "token went from {before} to {after} with appendonly"
    );
    // Without persistence the counter is lost, but tokens never go below
    // the server's clock in microseconds, so they still increase.
    let volatile = RedisServer::start();
    let (before, after) = tokens_across_restart(volatile).await;
    assert!(
        after > before,
        "token went from {before} to {after} without persistence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_fencing_counter_does_not_make_tokens_go_back() {
    let redis = test_support::redis::shared();
    let name = unique_name("evicted-fence");
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let lock = locks.mutex(&name).unwrap();
    let first = lock.lock().await.unwrap();
    let token = first.fencing_token();
    first.release().await.unwrap();
    // An allkeys-* eviction policy (or an operator) removes the counter.
    let fence = format!("{{{}}}:fence", locks.lock_key(&name).unwrap());
    assert_eq!(redis.cli(&["DEL", &fence]), "1");
    let second = lock.lock().await.unwrap();
    assert!(
        second.fencing_token() > token,
        "{} after {token}",
        second.fencing_token()
    );
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_fencing_counter_is_a_typed_error_and_takes_nothing() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    // i64::MAX: INCR overflows. 2^53 - 1: the next token would be past what
    // a Lua number holds exactly (a duplicate token in waiting).
    for start in [i64::MAX, (1_i64 << 53) - 1] {
        let name = unique_name("exhausted-fence");
        let key = locks.lock_key(&name).unwrap();
        let fence = format!("{{{key}}}:fence");
        assert_eq!(redis.cli(&["SET", &fence, &start.to_string()]), "OK");
        let r = locks.mutex(&name).unwrap().try_lock().await;
        assert!(matches!(r, Err(Error::Exhausted { .. })), "{start}: {r:?}");
        assert_eq!(
            redis.cli(&["EXISTS", &key]),
            "0",
            "{start}: the lock key was left set"
        );
    }
}

/// The acquire script run twice with one token (a client resending it after
/// a lost reply, as redis-rs's cluster client does on a response timeout)
/// says so, instead of reporting our own key as someone else's.
#[test]
fn the_acquire_script_recognises_its_own_earlier_run() {
    let redis = test_support::redis::shared();
    // The acquire script as the registry sends it: its preludes first.
    let script = concat!(
        include_str!("../src/scripts/holds.lua"),
        include_str!("../src/scripts/fence.lua"),
        include_str!("../src/scripts/acquire.lua")
    );
    let key = unique_name("resent");
    let fence = format!("{{{key}}}:fence");
    let first = redis.cli(&["EVAL", script, "2", &key, &fence, "tok", "10000"]);
    assert!(first.starts_with('1'), "{first}");
    let again = redis.cli(&["EVAL", script, "2", &key, &fence, "tok", "10000"]);
    assert_eq!(again.split_whitespace().next(), Some("2"), "{again}");
    let other = redis.cli(&["EVAL", script, "2", &key, &fence, "other", "10000"]);
    assert_eq!(other.split_whitespace().next(), Some("0"), "{other}");
}

fn redis_py(url: &str, key: &str, args: &[&str]) -> std::process::Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis_py_lock.py");
    std::process::Command::new("python3")
        .arg(script)
        .args([url, key])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/install-servers.sh installs redis-py)")
}

fn output(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "redis-py helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_and_redis_py_locks_exclude_each_other() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    let options = RedisOptions::new().recheck_interval(Duration::from_millis(100));
    let locks = connect(&url, options).await;
    let name = unique_name("py");
    let key = locks.lock_key(&name).unwrap();
    assert_eq!(key, name, "empty prefix: the key is the name");
    let lock = locks.mutex(&name).unwrap();

    // distlock holds: redis-py cannot take it.
    let guard = lock.lock().await.unwrap();
    let py = tokio::task::spawn_blocking({
        let (url, key) = (url.clone(), key.clone());
        move || output(redis_py(&url, &key, &["try"]))
    });
    assert_eq!(py.await.unwrap(), "busy");
    guard.release().await.unwrap();
    let py = tokio::task::spawn_blocking({
        let (url, key) = (url.clone(), key.clone());
        move || output(redis_py(&url, &key, &["try"]))
    });
    assert_eq!(py.await.unwrap(), "acquired");

    // redis-py holds for a second: distlock waits, and gets in after its
    // release (which publishes nothing) within a re-check interval.
    let holder = redis_py(&url, &key, &["hold", "1"]);
    let deadline = Instant::now() + test_support::PEER_START;
    while redis.cli(&["EXISTS", &key]) != "1" {
        assert!(Instant::now() < deadline, "redis-py never took the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "took redis-py's lock"
    );
    let g = lock
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("redis-py's release was not noticed");
    let py_out = tokio::task::spawn_blocking(move || output(holder))
        .await
        .unwrap();
    assert_eq!(py_out, "acquired\nreleased");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_acl_users_come_from_the_url() {
    let redis = RedisServer::start_with(&[
        "--requirepass",
        "s3cret",
        "--user",
        "alice",
        "on",
        ">wonderland",
        "~*",
        "&*",
        "+@all",
        "--user",
        "bob",
        "on",
        ">builder",
        "~*",
        "&*",
        "+@all",
        "-evalsha",
        "-eval",
    ]);
    let port = redis.port();
    for url in [
        format!("redis://:s3cret@127.0.0.1:{port}"),
        format!("redis://alice:wonderland@127.0.0.1:{port}"),
    ] {
        let locks = connect(&url, RedisOptions::new()).await;
        let g = locks
            .mutex(&unique_name("acl"))
            .unwrap()
            .lock()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let wrong = RedisProvider::connect(&format!("redis://alice:wrong@127.0.0.1:{port}")).await;
    let e = wrong.expect_err("a wrong password connected");
    assert!(e.is_not_allowed() && !e.is_retryable(), "{e:?}");
    // No password: the connection opens, every command is refused, typed.
    match RedisProvider::connect(&format!("redis://127.0.0.1:{port}")).await {
        Err(e) => assert!(e.is_not_allowed(), "{e:?}"),
        Ok(locks) => {
            let r = locks.mutex("acl/none").unwrap().try_lock().await;
            assert!(matches!(&r, Err(e) if e.is_not_allowed()), "{r:?}");
        }
    }
    // A user without the scripting commands: not allowed, not "busy", not
    // "down".
    let bob = connect(
        &format!("redis://bob:builder@127.0.0.1:{port}"),
        RedisOptions::new(),
    )
    .await;
    let r = bob.mutex("acl/bob").unwrap().try_lock().await;
    assert!(
        matches!(
            &r,
            Err(Error::NotAllowed {
                backend: "redis",
                ..
            })
        ),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_unique_across_clients_and_increasing_per_generator() {
    let url = test_support::redis::shared().url();
    let clients: [Arc<dyn Provider>; 2] = [
        Arc::new(connect(&url, RedisOptions::new()).await),
        Arc::new(connect(&url, RedisOptions::new()).await),
    ];
    test_support::conformance::ids_unique_and_increasing(clients).await;
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    command_calls(redis, "evalsha")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_key_alive_for_three_ttls_and_stops_at_release() {
    let redis = RedisServer::start();
    let locks = connect(&redis.url(), RedisOptions::new()).await;
    let name = unique_name("watchdog");
    let key = locks.lock_key(&name).unwrap();
    let ttl = Duration::from_millis(600);
    let guard = locks
        .with_lease(LeaseOptions::new(ttl).unwrap())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < ttl * 3 {
        let pttl: i64 = redis.cli(&["PTTL", &key]).parse().unwrap();
        assert!(pttl > 0, "key expired under the watchdog");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewals = evalsha_calls(&redis);
    assert!(
        renewals >= 4,
        "acquire + at least 3 renewals, got {renewals}"
    );
    guard.release().await.unwrap();
    assert_eq!(redis.cli(&["EXISTS", &key]), "0");
    let after_release = evalsha_calls(&redis);
    tokio::time::sleep(ttl).await;
    assert_eq!(
        evalsha_calls(&redis),
        after_release,
        "renewed after release"
    );
}

#[test]
fn arbitrary_names_ttls_and_timeouts_give_typed_errors_and_store_nothing() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client: Arc<dyn Provider> =
        Arc::new(rt.block_on(connect(&redis.url(), RedisOptions::new())));
    let prefix = unique_name("props") + "/";
    // The server is this test's alone, and handing out primitives does no
    // I/O: while names are tried, it must stay empty.
    test_support::properties::check(rt.handle(), &client, &prefix, |_| {
        redis.cli(&["DBSIZE"]) != "0"
    });
}

/// `INFO stats` `expired_keys`: keys the server expired so far.
fn expired_keys(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// `INFO commandstats` calls of `command` (lower case) so far.
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_take_turns_with_one_attempt_per_handoff_and_no_subscribe_per_wait() {
    let redis = RedisServer::start();
    // Re-checks far apart: only hand-overs move the lock along.
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let mut providers = Vec::new();
    for _ in 0..4 {
        providers.push(connect(&redis.url(), slow.clone()).await);
    }
    let name = unique_name("turns");
    let rounds = 60;
    // Warm up: every provider has waited once (subscribed, scripts loaded).
    let mut tasks = Vec::new();
    for p in &providers {
        let lock = p.with_lease(long()).unwrap().mutex(&name).unwrap();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                lock.lock().await.unwrap().release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(SLACK * 4, t).await.unwrap().unwrap();
    }
    // The turns a release left the lock free for clients outside the line
    // (after a long streak of hand-overs): the next holder there may be
    // the releaser again.
    let turns = Arc::new(AtomicUsize::new(0));
    let mut listener = redis::Client::open(redis.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    let key = providers[0].lock_key(&name).unwrap();
    listener
        .subscribe(format!("{{{key}}}:released"))
        .await
        .unwrap();
    let listening = {
        let turns = Arc::clone(&turns);
        tokio::spawn(async move {
            let mut messages = listener.on_message();
            while let Some(msg) = futures::StreamExt::next(&mut messages).await {
                let payload: String = msg.get_payload().unwrap();
                if payload.starts_with("turn:") {
                    turns.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    let (evalsha, subscribes) = (calls(&redis, "evalsha"), calls(&redis, "subscribe"));
    let unsubscribes = calls(&redis, "unsubscribe");
    let expired = expired_keys(&redis);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, p) in providers.iter().enumerate() {
        let lock = p.with_lease(long()).unwrap().mutex(&name).unwrap();
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = lock.lock().await.unwrap();
                order.lock().unwrap().push((g.fencing_token(), i));
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(SLACK * 10, t)
            .await
            .expect("no lock stalls (re-checks are 30 s apart)")
            .unwrap();
    }
    let acquisitions = 4 * rounds;
    let per = |n: u64| n as f64 / f64::from(acquisitions);
    let evalsha = per(calls(&redis, "evalsha") - evalsha);
    let mut order = order.lock().unwrap().clone();
    order.sort_unstable();
    // Only while every provider still has rounds to go: at the end the
    // last one left takes the lock again and again with nobody waiting.
    let mut done = [0u32; 4];
    let together = order
        .iter()
        .position(|&(_, i)| {
            done[i] += 1;
            done[i] == rounds
        })
        .unwrap_or(order.len());
    // And only once every provider has held it once: before that, a task
    // not yet scheduled has not asked, and nobody may be in line when the
    // first holder releases (its taking the lock again is no lost
    // hand-over).
    let mut seen = [false; 4];
    let formed = order
        .iter()
        .position(|&(_, i)| {
            seen[i] = true;
            seen.iter().all(|&s| s)
        })
        .unwrap_or(0);
    let order = &order[formed..together.max(formed)];
    let switches = order.windows(2).filter(|w| w[0].1 != w[1].1).count();
    let repeats = order.len().saturating_sub(1) - switches;
    let share = switches as f64 / order.len().saturating_sub(1).max(1) as f64;
    // A repeat while others wait is a hand-over nobody claimed within the
    // reservation (50 ms, a woken task not scheduled in time on a loaded
    // machine): the reservation key then expires. The lock keys themselves
    // (30 s leases, released) never expire here, so the server's count of
    // expired keys bounds the repeats this protocol may make.
    let reservations_expired = expired_keys(&redis) - expired;
    // The last releases' messages are in flight at most a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    listening.abort();
    let turns = turns.load(Ordering::SeqCst);
    println!(
        "EVALSHA per acquisition {evalsha:.2}, handoff share {share:.2} over {} acquisitions, {repeats} repeats, {reservations_expired} reservations expired, {turns} turns",
        order.len()
    );
    // An acquisition, a release and at most one refused attempt (the
    // releaser asking again at once) per turn, give or take a few.
    assert!(evalsha <= 3.2, "{evalsha:.2} EVALSHA per acquisition");
    let at: Vec<usize> = order
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0].1 == w[1].1)
        .map(|(k, _)| k + formed)
        .collect();
    assert!(
        repeats as u64 <= reservations_expired + turns as u64,
        "{repeats} repeats with others waiting (at acquisitions {at:?} of {}), only {reservations_expired} reservations expired and {turns} turns (handoff share {share:.2}): providers do not take turns",
        4 * rounds
    );
    assert_eq!(calls(&redis, "subscribe"), subscribes, "SUBSCRIBE per wait");
    assert_eq!(
        calls(&redis, "unsubscribe"),
        unsubscribes,
        "UNSUBSCRIBE per wait"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_nobody_claims_is_passed_on_and_a_leaving_waiter_leaves_the_line() {
    let redis = test_support::redis::shared();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let a = connect(&redis.url(), slow.clone()).await;
    let b = connect(&redis.url(), slow.clone()).await;
    let c = connect(&redis.url(), slow).await;
    let name = unique_name("pass");
    let key = a.lock_key(&name).unwrap();
    let waiting = format!("{{{key}}}:waiting");
    let (lock_a, lock_b, lock_c) = (
        a.with_lease(long()).unwrap().mutex(&name).unwrap(),
        b.with_lease(long()).unwrap().mutex(&name).unwrap(),
        c.with_lease(long()).unwrap().mutex(&name).unwrap(),
    );

    // B waits, then gives up: it leaves the line.
    let held = lock_a.lock().await.unwrap();
    assert!(lock_b
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    let deadline = Instant::now() + SLACK;
    while !redis.cli(&["ZSCORE", &waiting, b.line_id()]).is_empty() {
        assert!(
            Instant::now() < deadline,
            "B is still in line after giving up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // C waits; B is put back in line by hand, ahead of C, as if its waiter
    // had left just as the release came: the hand-over goes to B, which
    // has nobody waiting (its channel still lingers) and passes it to C.
    let task = tokio::spawn(async move { lock_c.lock().await.map(|g| (Instant::now(), g)) });
    let deadline = Instant::now() + SLACK;
    while redis.cli(&["ZSCORE", &waiting, c.line_id()]).is_empty() {
        assert!(Instant::now() < deadline, "C never joined the line");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(redis.cli(&["ZADD", &waiting, "0", b.line_id()]), "1");
    // Alive (its subscriber answers): a place with no liveness deadline,
    // or a passed one, would be skipped by the release.
    let alive = format!("{{{key}}}:waiting:alive");
    assert_eq!(
        redis.cli(&["ZADD", &alive, "99999999999999", b.line_id()]),
        "1"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, g) = tokio::time::timeout(SLACK, task)
        .await
        .expect("C got the lock passed on by B, long before its 30 s re-check")
        .unwrap()
        .unwrap();
    assert!(acquired.duration_since(released) < Duration::from_secs(2));
    g.release().await.unwrap();
    assert_eq!(redis.cli(&["EXISTS", &waiting]), "0", "the line is empty");
}

/// A provider closed while its plain waiters wait, holding nothing itself
/// (so its close has no release to wait for): the waiters it wakes leave
/// the line before the connection goes, and the next release goes straight
/// to the waiter of another provider, not to a reservation for the closed
/// one (which would keep it out for 50 ms, or until its re-check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_holding_nothing_takes_the_provider_out_of_the_line() {
    let redis = test_support::redis::shared();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    for round in 0..5 {
        let holding = connect(&redis.url(), slow.clone()).await;
        let closing = connect(&redis.url(), slow.clone()).await;
        let other = connect(&redis.url(), slow.clone()).await;
        let name = unique_name("close-line");
        let key = holding.lock_key(&name).unwrap();
        let waiting = format!("{{{key}}}:waiting");
        let held = holding
            .with_lease(long())
            .unwrap()
            .mutex(&name)
            .unwrap()
            .lock()
            .await
            .unwrap();
        let mut closed_waiters = Vec::new();
        for _ in 0..3 {
            let lock = closing.with_lease(long()).unwrap().mutex(&name).unwrap();
            closed_waiters.push(tokio::spawn(async move { lock.lock().await }));
        }
        let deadline = Instant::now() + SLACK;
        while redis
            .cli(&["ZSCORE", &waiting, closing.line_id()])
            .is_empty()
        {
            assert!(
                Instant::now() < deadline,
                "the closing provider never joined the line"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The other provider's waiter is in line behind it.
        let lock = other.with_lease(long()).unwrap().mutex(&name).unwrap();
        let task = tokio::spawn(async move { lock.lock().await.map(|g| (Instant::now(), g)) });
        let deadline = Instant::now() + SLACK;
        while redis.cli(&["ZSCORE", &waiting, other.line_id()]).is_empty() {
            assert!(
                Instant::now() < deadline,
                "the other provider never joined the line"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        closing.close().await.unwrap();
        assert!(
            redis
                .cli(&["ZSCORE", &waiting, closing.line_id()])
                .is_empty(),
            "round {round}: the closed provider is still in line when close() returns"
        );
        for waiter in closed_waiters {
            let r = tokio::time::timeout(SLACK, waiter).await.unwrap().unwrap();
            assert!(matches!(r, Err(distlock_core::Error::Closed)), "{r:?}");
        }
        let released = Instant::now();
        held.release().await.unwrap();
        let (acquired, g) = tokio::time::timeout(SLACK, task)
            .await
            .expect("the other waiter was not handed the lock")
            .unwrap()
            .unwrap();
        // Straight to it: not through a reservation for the closed
        // provider, which nobody would pass on (the other waiter would
        // then wait for a re-check).
        let after = acquired.duration_since(released);
        assert!(
            after < Duration::from_secs(1),
            "round {round}: {after:?} from the release to the other waiter"
        );
        g.release().await.unwrap();
        holding.close().await.unwrap();
        other.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_redis_py_rechecks_soon_after_it_releases() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    // Re-checks far apart: only the short re-checks behind a holder that
    // does not publish can find the lock free soon.
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&url, slow).await;
    let name = unique_name("py-soon");
    let key = locks.lock_key(&name).unwrap();
    let lock = locks.mutex(&name).unwrap();
    let holder = redis_py(&url, &key, &["hold", "0.5"]);
    let deadline = Instant::now() + test_support::PEER_START;
    while redis.cli(&["EXISTS", &key]) != "1" {
        assert!(Instant::now() < deadline, "redis-py never took the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let g = lock
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("redis-py's release was not noticed");
    // Held about 0.5 s; the doubling re-checks are at most ~0.5 s apart by then.
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?} behind a 0.5 s redis-py hold",
        started.elapsed()
    );
    assert_eq!(
        tokio::task::spawn_blocking(move || output(holder))
            .await
            .unwrap(),
        "acquired\nreleased"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquisition_is_small() {
    // What a waiting task keeps: the acquire future (each attempt's state
    // is boxed and dropped before the wait, and so is the key watch behind
    // a foreign holder). It was 7.9 KB, then 480 B; 432 B now.
    let url = test_support::redis::shared().url();
    let locks = connect(&url, RedisOptions::new()).await;
    let lock = locks.mutex(&unique_name("size")).unwrap();
    let waiting = lock.acquire(distlock_core::Wait::Forever);
    let size = std::mem::size_of_val(&*waiting);
    println!("Redis mutex acquire future: {size} bytes");
    assert!(size <= 512, "{size} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_for_a_provider_that_died_costs_waiters_its_ttl_and_try_lock_nothing() {
    let redis = test_support::redis::shared();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&redis.url(), slow).await;
    let name = unique_name("dead-reservation");
    let key = locks.lock_key(&name).unwrap();
    let handoff = format!("{{{key}}}:handoff");
    let lock = locks.mutex(&name).unwrap();
    // A release reserved the free lock for a provider that died before it
    // could come (a `distlock exec -w` that timed out and exited, say).
    assert_eq!(redis.cli(&["SET", &handoff, "pdead", "PX", "5000"]), "OK");
    // try_lock: the lock is free, so it is taken.
    let g = lock
        .try_lock()
        .await
        .unwrap()
        .expect("a reserved free lock is free");
    g.release().await.unwrap();
    // A waiting lock(): refused while reserved, it looks again when the
    // reservation expires, not at its 30 s re-check.
    assert_eq!(redis.cli(&["SET", &handoff, "pdead", "PX", "400"]), "OK");
    let started = Instant::now();
    let g = lock
        .lock_timeout(SLACK)
        .await
        .unwrap()
        .expect("in after the reservation expired");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    g.release().await.unwrap();
}

/// The ids of the clients that have key tracking on (the provider's
/// tracking connection).
fn tracking_clients(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| {
            line.split(' ')
                .any(|f| f.strip_prefix("flags=").is_some_and(|f| f.contains('t')))
        })
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect()
}

/// Holds `key` as a client that does not publish (as redis-py does), waits
/// until a distlock waiter has queued behind it, and returns that waiter.
async fn wait_behind_a_foreign_hold(
    redis: &RedisServer,
    locks: &RedisProvider,
    name: &str,
) -> tokio::task::JoinHandle<(Instant, distlock_core::LockGuard)> {
    let key = locks.lock_key(name).unwrap();
    assert_eq!(redis.cli(&["SET", &key, "py-token", "PX", "60000"]), "OK");
    let lock = locks.mutex(name).unwrap();
    let waiter = tokio::spawn(async move {
        let guard = lock
            .lock_timeout(SLACK * 4)
            .await
            .unwrap()
            .expect("the foreign release was not noticed");
        (Instant::now(), guard)
    });
    let waiting = format!("{{{key}}}:waiting");
    let deadline = Instant::now() + SLACK;
    while redis.cli(&["ZCARD", &waiting]) != "1" {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_holder_that_does_not_publish_is_told_by_the_server_not_polling() {
    let redis = RedisServer::start();
    // Re-checks far apart: only a notification can wake the waiter soon.
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&redis.url(), slow).await;
    let name = unique_name("tracked");
    let key = locks.lock_key(&name).unwrap();
    // Less the health checks' refreshes of the place in line.
    let before = evalsha_calls(&redis) - locks.line_refreshes();
    let waiter = wait_behind_a_foreign_hold(&redis, &locks, &name).await;
    // A foreign holder that extends its lease (as redis-py's `extend`):
    // the waiter is told, finds it held again, and waits on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(redis.cli(&["PEXPIRE", &key, "60000"]), "1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "took a lock that was held");
    let attempts = evalsha_calls(&redis) - locks.line_refreshes() - before;
    // Polling from 1 ms doubling would have tried about ten times by now;
    // told by the server: the first attempt, the one after subscribing,
    // and one after the PEXPIRE.
    assert!(attempts <= 4, "{attempts} attempts behind a held lock");
    assert_eq!(tracking_clients(&redis).len(), 1, "one tracking connection");
    let released = Instant::now();
    assert_eq!(redis.cli(&["DEL", &key]), "1");
    let (acquired, guard) = waiter.await.unwrap();
    let after = acquired - released;
    assert!(
        after < Duration::from_millis(250),
        "{after:?} from the foreign release to the acquisition"
    );
    guard.release().await.unwrap();

    // An expiry is a change too.
    let waiter = wait_behind_a_foreign_hold(&redis, &locks, &name).await;
    assert_eq!(redis.cli(&["PEXPIRE", &key, "400"]), "1");
    let (_, guard) = waiter.await.unwrap();
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_tracking_connection_wakes_the_waiter_and_is_reopened() {
    let redis = RedisServer::start();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&redis.url(), slow).await;
    let name = unique_name("tracked-cut");
    let key = locks.lock_key(&name).unwrap();
    let waiter = wait_behind_a_foreign_hold(&redis, &locks, &name).await;
    let deadline = Instant::now() + SLACK;
    let first = loop {
        if let [id] = tracking_clients(&redis).as_slice() {
            break id.clone();
        }
        assert!(Instant::now() < deadline, "no tracking connection");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(redis.cli(&["CLIENT", "KILL", "ID", &first]), "1");
    // The waiter re-checks, finds the lock still held and watches again
    // on a new connection.
    let deadline = Instant::now() + SLACK;
    loop {
        match tracking_clients(&redis).as_slice() {
            [id] if *id != first => break,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the tracking connection was not reopened"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!waiter.is_finished(), "took a lock that was held");
    let released = Instant::now();
    assert_eq!(redis.cli(&["DEL", &key]), "1");
    let (acquired, guard) = waiter.await.unwrap();
    assert!(
        acquired - released < Duration::from_millis(250),
        "{:?} from the foreign release to the acquisition",
        acquired - released
    );
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}

/// Calls of `command` the server counted (`INFO commandstats`), from
/// clients and from scripts.
fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits until the first waiter's read of its key (EXISTS on the tracking
/// connection) reached the server, then 300 ms more: time for its reply to
/// come back (through a proxy too) and for the waiter to record that the
/// read stands.
async fn first_read_done(redis: &RedisServer) {
    let deadline = Instant::now() + SLACK;
    while command_calls(redis, "exists") == 0 {
        assert!(
            Instant::now() < deadline,
            "the first waiter never read its key"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_key_share_one_tracking_read() {
    let redis = RedisServer::start();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&redis.url(), slow).await;
    let name = unique_name("tracked-shared");
    let key = locks.lock_key(&name).unwrap();
    let first = wait_behind_a_foreign_hold(&redis, &locks, &name).await;
    first_read_done(&redis).await;
    // A first health check's refresh of the place in line has run (on
    // this fresh server its script is loaded then: a NOSCRIPT and a second
    // EVALSHA, which the count below could not tell from an attempt).
    let deadline = Instant::now() + SLACK;
    while locks.line_refreshes() == 0 {
        assert!(
            Instant::now() < deadline,
            "no health check refreshed the place"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reads = command_calls(&redis, "exists");
    // Script calls other than the waiters' attempts: the health checks'
    // refreshes of the provider's place in line (see the crate docs,
    // "Liveness").
    let attempts_of = |redis: &RedisServer| evalsha_calls(redis) - locks.line_refreshes();
    let attempts = attempts_of(&redis);
    let mut waiters = Vec::new();
    for _ in 0..7 {
        let lock = locks.mutex(&name).unwrap();
        waiters.push(tokio::spawn(async move {
            let guard = lock
                .lock_timeout(SLACK * 4)
                .await
                .unwrap()
                .expect("the lock never came");
            guard.release().await.unwrap();
        }));
    }
    // Each new waiter makes its attempt, finds the foreign holder and
    // watches the key: on the standing read, with no read of its own.
    let deadline = Instant::now() + SLACK;
    while attempts_of(&redis) < attempts + 7 {
        assert!(Instant::now() < deadline, "the new waiters never tried");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let settled = attempts_of(&redis);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        command_calls(&redis, "exists"),
        reads,
        "a waiter read the key again though no change came"
    );
    // And every waiter sleeps on the watch: none polls instead.
    assert_eq!(attempts_of(&redis), settled, "a waiter polls");
    assert!(
        !first.is_finished() && waiters.iter().all(|w| !w.is_finished()),
        "took a held lock"
    );
    assert_eq!(tracking_clients(&redis).len(), 1, "one tracking connection");
    // One change wakes them all; they take the lock one after another,
    // well before their re-checks (30 s) or deadlines (12 s).
    let released = Instant::now();
    assert_eq!(redis.cli(&["DEL", &key]), "1");
    let (_, guard) = first.await.unwrap();
    guard.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert!(
        released.elapsed() < SLACK,
        "{:?} for eight waiters to take the lock in turn",
        released.elapsed()
    );
    locks.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracking_connection_that_stops_answering_is_replaced_and_its_watchers_woken() {
    let redis = RedisServer::start();
    let proxy = test_support::Proxy::start(redis.addr());
    // Re-checks far apart: only the tracking connection can wake a waiter
    // soon.
    let options = RedisOptions::new()
        .recheck_interval(Duration::from_secs(30))
        .response_timeout(Duration::from_millis(300));
    let locks = connect(&format!("redis://{}", proxy.addr()), options).await;
    let first = unique_name("tracked-silent-a");
    let second = unique_name("tracked-silent-b");
    let a = wait_behind_a_foreign_hold(&redis, &locks, &first).await;
    first_read_done(&redis).await;
    let old = tracking_clients(&redis);
    assert_eq!(old.len(), 1, "one tracking connection");
    // The tracking connection stops answering: open, but nothing passes
    // (the commands' connection is untouched).
    assert_eq!(proxy.silence_connections_that_sent(b"TRACKING"), 1);
    // A second waiter's read is the first request on it: no answer within
    // the response timeout, so the tracker replaces it, and the first
    // waiter, whose watch was on the silent one, is woken to read again on
    // the new one.
    let reads = command_calls(&redis, "exists");
    let b = wait_behind_a_foreign_hold(&redis, &locks, &second).await;
    let deadline = Instant::now() + SLACK;
    while command_calls(&redis, "exists") < reads + 2
        || !tracking_clients(&redis).iter().any(|id| !old.contains(id))
    {
        assert!(
            Instant::now() < deadline,
            "no new tracking connection with both keys read on it"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!a.is_finished() && !b.is_finished(), "took a held lock");
    // A change reaches each waiter through the new connection, long before
    // its 30 s re-check.
    for (name, waiter) in [(&first, a), (&second, b)] {
        let key = locks.lock_key(name).unwrap();
        let released = Instant::now();
        assert_eq!(redis.cli(&["DEL", &key]), "1");
        let (acquired, guard) = waiter.await.unwrap();
        assert!(
            acquired - released < Duration::from_secs(1),
            "{:?} from the foreign release to the acquisition of {name}",
            acquired - released
        );
        guard.release().await.unwrap();
    }
    locks.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_tracking_a_waiter_behind_a_foreign_holder_polls() {
    // An ACL user that may not use CLIENT: no tracking, short re-checks.
    let redis = RedisServer::start_with(&[
        "--user", "carol", "on", ">pw", "~*", "&*", "+@all", "-client",
    ]);
    let url = format!("redis://carol:pw@127.0.0.1:{}", redis.port());
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&url, slow).await;
    let name = unique_name("untracked");
    let key = locks.lock_key(&name).unwrap();
    let waiter = wait_behind_a_foreign_hold(&redis, &locks, &name).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(tracking_clients(&redis).is_empty(), "tracking was allowed");
    assert!(!waiter.is_finished(), "took a lock that was held");
    assert_eq!(redis.cli(&["DEL", &key]), "1");
    let released = Instant::now();
    let (acquired, guard) = waiter.await.unwrap();
    // The doubling re-checks are at most ~0.5 s apart by then.
    assert!(
        acquired - released < Duration::from_millis(1500),
        "{:?} from the foreign release to the acquisition",
        acquired - released
    );
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_void_once_someone_else_holds_the_lock() {
    // A release reserved the free lock for a provider, but a client that
    // ignores reservations (redis-py) took it first: that turn is gone, and
    // the reservation must not keep other waiters out once the lock is
    // free again.
    let redis = test_support::redis::shared();
    let slow = RedisOptions::new().recheck_interval(Duration::from_secs(30));
    let locks = connect(&redis.url(), slow).await;
    let name = unique_name("void-reservation");
    let key = locks.lock_key(&name).unwrap();
    let handoff = format!("{{{key}}}:handoff");
    assert_eq!(redis.cli(&["SET", &handoff, "pdead", "PX", "20000"]), "OK");
    let waiter = wait_behind_a_foreign_hold(redis, &locks, &name).await;
    assert_eq!(
        redis.cli(&["EXISTS", &handoff]),
        "0",
        "the reservation stayed"
    );
    assert!(!waiter.is_finished(), "took a lock that was held");
    let released = Instant::now();
    assert_eq!(redis.cli(&["DEL", &key]), "1");
    let (acquired, guard) = waiter.await.unwrap();
    assert!(
        acquired - released < Duration::from_secs(2),
        "{:?} from the foreign release to the acquisition",
        acquired - released
    );
    guard.release().await.unwrap();
}
