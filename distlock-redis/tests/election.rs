//! Redis leader election on a real redis-server: one leader, increasing
//! terms across resign, drop and expiry, leader() and observe() following
//! every change (an expiry included), withdrawn campaigns, bad ids.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Election, Error, LeaderInfo, LeaseOptions, LostReason, Provider};
use distlock_redis::{RedisOptions, RedisProvider};
use futures::StreamExt;
use test_support::{unique_name, RedisServer};

const SLACK: Duration = Duration::from_secs(3);

async fn connect(url: &str) -> RedisProvider {
    RedisProvider::connect_with(url, RedisOptions::new())
        .await
        .unwrap()
}

fn long() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(30)).unwrap()
}

fn queue_key(prefix_name: &str) -> String {
    format!("{{{prefix_name}}}:elect:queue")
}

async fn until_queued(redis: &RedisServer, name: &str, n: usize) {
    let deadline = Instant::now() + SLACK;
    while redis.cli(&["ZCARD", &queue_key(name)]) != n.to_string() {
        assert!(Instant::now() < deadline, "the queue never held {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The next item of an observer, within the slack.
async fn next(stream: &mut distlock_core::LeaderStream) -> Option<LeaderInfo> {
    tokio::time::timeout(SLACK, stream.next())
        .await
        .expect("no leader change observed")
        .expect("the stream ended")
        .unwrap()
}

/// Three candidates on three providers: one leads at a time; each
/// resignation or drop elects the next, in campaign order, with a greater
/// term; leader() says who.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_with_increasing_terms() {
    let redis = test_support::redis::shared();
    let name = unique_name("elect");
    let mut elections: Vec<Arc<dyn Election>> = Vec::new();
    for _ in 0..3 {
        let p = connect(&redis.url()).await;
        elections.push(p.with_lease(long()).unwrap().election(&name).unwrap());
    }
    assert_eq!(elections[0].leader().await.unwrap(), None);
    let first = elections[0].campaign("alpha").await.unwrap();
    assert_eq!(
        elections[2].leader().await.unwrap(),
        Some(LeaderInfo {
            id: "alpha".into(),
            term: first.term()
        })
    );
    let mut pending = Vec::new();
    for (i, id) in [(1, "beta"), (2, "gamma")] {
        let e = Arc::clone(&elections[i]);
        pending.push(tokio::spawn(async move { e.campaign(id).await.unwrap() }));
        until_queued(redis, &name, pending.len()).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pending.iter().all(|t| !t.is_finished()), "two leaders");
    let t1 = first.term();
    first.resign().await.unwrap();
    let second = tokio::time::timeout(SLACK, pending.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.candidate(), "beta");
    assert!(second.term() > t1);
    assert_eq!(
        elections[0].leader().await.unwrap().unwrap().id,
        "beta".to_owned()
    );
    assert!(!pending[0].is_finished(), "two leaders");
    let t2 = second.term();
    drop(second);
    let third = tokio::time::timeout(SLACK, pending.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.candidate(), "gamma");
    assert!(third.term() > t2);
    third.resign().await.unwrap();
    assert_eq!(elections[1].leader().await.unwrap(), None);
}

/// observe() yields the leader now, then each change: a win, a
/// resignation, and an expiry (a lease not renewed), which publishes
/// nothing; terms keep increasing across all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_wins_resignations_and_expiries() {
    let redis = test_support::redis::shared();
    let name = unique_name("observe");
    let p = connect(&redis.url()).await;
    let watcher = connect(&redis.url()).await;
    let manual = LeaseOptions::manual(Duration::from_millis(700)).unwrap();
    let election = p.with_lease(manual).unwrap().election(&name).unwrap();
    let mut seen = watcher.election(&name).unwrap().observe();
    assert_eq!(next(&mut seen).await, None);
    // A win.
    let a = election.campaign("a").await.unwrap();
    let ta = a.term();
    assert_eq!(
        next(&mut seen).await,
        Some(LeaderInfo {
            id: "a".into(),
            term: ta
        })
    );
    // An expiry: nobody renews, nothing is published.
    let expired_at = Instant::now();
    assert_eq!(next(&mut seen).await, None);
    assert!(expired_at.elapsed() < Duration::from_millis(700) + SLACK);
    assert_eq!(a.lost().await, LostReason::Expired);
    assert_eq!(election.leader().await.unwrap(), None);
    // A new leader, then a resignation.
    let b = election.campaign("b").await.unwrap();
    assert!(b.term() > ta);
    assert_eq!(next(&mut seen).await.unwrap().id, "b");
    let tb = b.term();
    b.resign().await.unwrap();
    assert_eq!(next(&mut seen).await, None);
    let c = election.campaign("c").await.unwrap();
    assert!(c.term() > tb);
    assert_eq!(next(&mut seen).await.unwrap().id, "c");
    drop(c);
    assert_eq!(next(&mut seen).await, None);
}

/// A campaign cancelled while queued withdraws: it leaves no entry and is
/// never elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_campaign_withdraws() {
    let redis = test_support::redis::shared();
    let name = unique_name("withdraw");
    let p = connect(&redis.url()).await;
    let election = p.with_lease(long()).unwrap().election(&name).unwrap();
    let leader = election.campaign("leader").await.unwrap();
    let e = Arc::clone(&election);
    let r = tokio::time::timeout(Duration::from_millis(300), async move {
        e.campaign("quitter").await
    })
    .await;
    assert!(r.is_err(), "elected while another leads");
    until_queued(redis, &name, 0).await;
    leader.resign().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(election.leader().await.unwrap(), None);
}

/// Bad candidate ids are typed errors and store nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_candidate_ids_are_typed_errors() {
    let redis = test_support::redis::shared();
    let name = unique_name("bad-id");
    let p = connect(&redis.url()).await;
    let election = p.election(&name).unwrap();
    for bad in [
        String::new(),
        "x".repeat(257),
        "a\nb".into(),
        "\u{7f}".into(),
    ] {
        let r = election.campaign(&bad).await;
        assert!(matches!(r, Err(Error::InvalidOptions(_))), "{bad:?}: {r:?}");
    }
    let ok = "a candidate with spaces";
    let l = election.campaign(ok).await.unwrap();
    assert_eq!(election.leader().await.unwrap().unwrap().id, ok);
    l.resign().await.unwrap();
    let keys = redis.cli(&["KEYS", &format!("*{name}*")]);
    assert!(
        keys.lines().all(|k| k.ends_with(":elect:fence")),
        "left behind: {keys}"
    );
}

/// An election and a mutex of the same name are one lock: while the mutex
/// holds, a campaign is refused with `Conflict` (it does not wait), and
/// while the election has a leader the mutex is refused; after each lets
/// go the other gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_and_a_mutex_of_one_name_are_one_lock() {
    let redis = test_support::redis::shared();
    let name = unique_name("one-lock");
    let p = connect(&redis.url()).await;
    let guard = p.mutex(&name).unwrap().lock().await.unwrap();
    let refused = tokio::time::timeout(SLACK, p.election(&name).unwrap().campaign("x"))
        .await
        .expect("refused at once, not waiting");
    assert!(
        refused.as_ref().is_err_and(Error::is_conflict),
        "{refused:?}"
    );
    guard.release().await.unwrap();
    let leader = tokio::time::timeout(SLACK, p.election(&name).unwrap().campaign("x"))
        .await
        .unwrap()
        .unwrap();
    let refused = p.mutex(&name).unwrap().try_lock().await;
    assert!(
        refused.as_ref().is_err_and(Error::is_conflict),
        "{refused:?}"
    );
    leader.resign().await.unwrap();
    p.mutex(&name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A provider's close ends its leadership and its observers' streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_leadership_and_observation() {
    let redis = test_support::redis::shared();
    let name = unique_name("close");
    let p = connect(&redis.url()).await;
    let other = connect(&redis.url()).await;
    let election = p.election(&name).unwrap();
    let leader = election.campaign("closing").await.unwrap();
    let mut own = election.observe();
    assert_eq!(next(&mut own).await.unwrap().id, "closing");
    let mut seen = other.election(&name).unwrap().observe();
    assert_eq!(next(&mut seen).await.unwrap().id, "closing");
    p.close().await.unwrap();
    assert_eq!(leader.lost().await, LostReason::ProviderClosed);
    assert_eq!(next(&mut seen).await, None);
    let end = tokio::time::timeout(SLACK, async {
        while let Some(item) = own.next().await {
            if matches!(item, Err(Error::Closed)) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(end, "the closed provider's observer did not report Closed");
    assert!(own.next().await.is_none());
}

/// An observer that is not polled while the leader changes several times
/// sees the latest leader, not each one in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_that_falls_behind_sees_the_latest() {
    let redis = test_support::redis::shared();
    let name = unique_name("behind");
    let p = connect(&redis.url()).await;
    let election = p.election(&name).unwrap();
    let mut seen = election.observe();
    assert_eq!(next(&mut seen).await, None);
    for id in ["one", "two"] {
        election.campaign(id).await.unwrap().resign().await.unwrap();
    }
    let last = election.campaign("three").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        next(&mut seen).await,
        Some(LeaderInfo {
            id: "three".into(),
            term: last.term()
        })
    );
    last.resign().await.unwrap();
    assert_eq!(next(&mut seen).await, None);
}
