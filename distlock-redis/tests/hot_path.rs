//! The uncontended hot path of the Redis mutex, counted on a real
//! redis-server with `MONITOR`: what one lock + release runs inside its
//! scripts (the budget: at most 6, the floor being 3), and the
//! fencing rule's edge cases (a counter ahead of the clock, one that is not
//! an integer, one with a TTL).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use distlock_core::{Error, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::{unique_name, RedisServer};

async fn connect(url: &str) -> RedisProvider {
    RedisProvider::connect_with(url, RedisOptions::new())
        .await
        .expect("connect to the test redis-server")
}

/// The commands the server ran inside scripts (`[0 lua]` lines of
/// `MONITOR`) while `work` ran, in order.
async fn commands_inside_scripts<F: std::future::Future<Output = ()>>(
    redis: &RedisServer,
    work: F,
) -> Vec<String> {
    let mut monitor = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &redis.port().to_string(),
            "monitor",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(monitor.stdout.take().unwrap()).lines();
    // MONITOR answers OK once it is on.
    assert_eq!(lines.next().unwrap().unwrap(), "OK");
    work.await;
    // A marker after the work: every line before it belongs to the work.
    assert_eq!(redis.cli(&["ECHO", "hot-path-done"]), "hot-path-done");
    let mut inside = Vec::new();
    for line in lines {
        let line = line.unwrap();
        if line.contains("\"ECHO\" \"hot-path-done\"") {
            break;
        }
        if let Some((_, command)) = line.split_once(" lua] ") {
            inside.push(command.to_owned());
        }
    }
    monitor.kill().unwrap();
    monitor.wait().unwrap();
    inside
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_uncontended_lock_and_release_run_at_most_six_commands_inside_scripts() {
    // A server of its own: MONITOR sees this test's commands only.
    let redis = RedisServer::start();
    let locks = connect(&redis.url()).await;
    let name = unique_name("hot-path");
    let lock = locks.mutex(&name).unwrap();
    // Once before counting: the scripts loaded, the connections up.
    lock.lock().await.unwrap().release().await.unwrap();
    let inside = commands_inside_scripts(&redis, async {
        let guard = lock.lock().await.unwrap();
        guard.release().await.unwrap();
    })
    .await;
    println!("{} commands inside scripts:", inside.len());
    for command in &inside {
        println!("  {command}");
    }
    assert!(
        inside.len() <= 6,
        "{} commands inside scripts (budget 6): {inside:#?}",
        inside.len()
    );
    // Nothing but the lock key, the fencing counter and the waiters'
    // keys is touched: no holder record, no PUBLISH with nobody waiting.
    for command in &inside {
        assert!(
            !command.contains(":holder") && !command.contains("PUBLISH"),
            "{command}"
        );
    }
    locks.close().await.unwrap();
}

/// A release with a provider in line sets the lock key to that provider's
/// reservation in one write: the key goes from the holder's value to the
/// reservation to the waiter's value, never deleted in between (a `DEL`
/// and a `SET` of the reservation were two calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_overwrites_the_lock_key_without_deleting_it() {
    // A server of its own: MONITOR sees this test's commands only.
    let redis = RedisServer::start();
    let (holder, waiter) = (connect(&redis.url()).await, connect(&redis.url()).await);
    let name = unique_name("hand-over");
    let key = holder.lock_key(&name).unwrap();
    let line = format!("{{{key}}}:waiting");
    let guard = holder.mutex(&name).unwrap().lock().await.unwrap();
    let waiting = {
        let lock = waiter.mutex(&name).unwrap();
        tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(30)).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while redis.cli(&["ZCARD", &line]) != "1" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never joined the line"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let inside = commands_inside_scripts(&redis, async {
        guard.release().await.unwrap();
        let handed = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("handed over within 30 s");
        handed.release().await.unwrap();
    })
    .await;
    println!("{} commands inside scripts:", inside.len());
    for command in &inside {
        println!("  {command}");
    }
    let on_key: Vec<&String> = inside
        .iter()
        .filter(|c| c.split(' ').nth(1) == Some(&format!("\"{key}\"")[..]))
        .collect();
    // The release: GET, SET (the reservation); the claim: SET NX … GET
    // (finds it), SET; the waiter's own release: GET, DEL.
    let verbs: Vec<&str> = on_key
        .iter()
        .map(|c| c.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        verbs,
        ["\"GET\"", "\"SET\"", "\"SET\"", "\"SET\"", "\"GET\"", "\"DEL\""],
        "{on_key:#?}"
    );
    assert!(
        on_key[1].contains("PX"),
        "the reservation expires: {}",
        on_key[1]
    );
    assert!(
        inside
            .iter()
            .any(|c| c.starts_with("\"PUBLISH\"") && c.contains("to:")),
        "the release wakes the waiter by its id: {inside:#?}"
    );
    holder.close().await.unwrap();
    waiter.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_ahead_of_the_clock_goes_on_from_where_it_is() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url()).await;
    let name = unique_name("fence-ahead");
    let key = locks.lock_key(&name).unwrap();
    let fence = format!("{{{key}}}:fence");
    // Far past the server's TIME in µs (about 1.8e15 today), below 2^53.
    let ahead: u64 = 5_000_000_000_000_000;
    assert_eq!(redis.cli(&["SET", &fence, &ahead.to_string()]), "OK");
    let lock = locks.mutex(&name).unwrap();
    let guard = lock.lock().await.unwrap();
    assert_eq!(guard.fencing_token(), ahead + 1);
    assert_eq!(redis.cli(&["GET", &fence]), (ahead + 1).to_string());
    guard.release().await.unwrap();
    // An earlier version's INCR on the same counter stays in the order.
    assert_eq!(redis.cli(&["INCR", &fence]), (ahead + 2).to_string());
    let guard = lock.lock().await.unwrap();
    assert_eq!(guard.fencing_token(), ahead + 3);
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_that_is_not_an_integer_is_left_exactly_as_it_was() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url()).await;
    // Strings INCR refuses: not a number, a leading zero, past i64, "-0".
    for bad in [
        "not-a-number",
        "007",
        "9223372036854775808",
        "-0",
        "1.5",
        "+1",
    ] {
        let name = unique_name("fence-bad");
        let key = locks.lock_key(&name).unwrap();
        let fence = format!("{{{key}}}:fence");
        assert_eq!(redis.cli(&["SET", &fence, bad, "PX", "600000"]), "OK");
        let r = locks.mutex(&name).unwrap().try_lock().await;
        assert!(matches!(r, Err(Error::Conflict { .. })), "{bad:?}: {r:?}");
        assert_eq!(redis.cli(&["GET", &fence]), bad);
        let ttl: i64 = redis.cli(&["PTTL", &fence]).parse().unwrap();
        assert!(ttl > 500_000, "{bad:?}: the counter's TTL went: {ttl}");
        assert_eq!(redis.cli(&["EXISTS", &key]), "0", "{bad:?}");
    }
    // A counter of another type: untouched too.
    let name = unique_name("fence-list");
    let key = locks.lock_key(&name).unwrap();
    let fence = format!("{{{key}}}:fence");
    assert_eq!(redis.cli(&["RPUSH", &fence, "x"]), "1");
    let r = locks.mutex(&name).unwrap().try_lock().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(redis.cli(&["LRANGE", &fence, "0", "-1"]), "x");
    assert_eq!(redis.cli(&["EXISTS", &key]), "0");
    // A negative counter (INCR takes it): the clock's floor.
    let name = unique_name("fence-negative");
    let key = locks.lock_key(&name).unwrap();
    let fence = format!("{{{key}}}:fence");
    assert_eq!(redis.cli(&["SET", &fence, "-5"]), "OK");
    let guard = locks.mutex(&name).unwrap().lock().await.unwrap();
    assert!(guard.fencing_token() > 1_000_000_000_000_000);
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_folded_into_the_lock_key() {
    let redis = test_support::redis::shared();
    let locks = connect(&redis.url()).await;
    let name = unique_name("folded");
    let key = locks.lock_key(&name).unwrap();
    let before = std::time::SystemTime::now();
    let guard = locks.mutex(&name).unwrap().lock().await.unwrap();
    // No holder record is written: the lock key's value carries the owner.
    assert_eq!(redis.cli(&["EXISTS", &format!("{{{key}}}:holder")]), "0");
    let snapshot = locks
        .inspect(&name, distlock_core::PrimitiveKind::Mutex)
        .await
        .unwrap();
    let holder = &snapshot.holders[0];
    assert_eq!(holder.fencing_token, Some(guard.fencing_token()));
    assert_eq!(holder.foreign, None);
    assert!(holder.owner.is_some(), "{snapshot:?}");
    let at = holder.acquired_at.unwrap();
    let slack = Duration::from_secs(1);
    assert!(at + slack >= before && at <= std::time::SystemTime::now() + slack);
    guard.release().await.unwrap();
    locks.close().await.unwrap();
}
