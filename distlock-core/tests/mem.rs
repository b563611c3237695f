//! In-process backend: what the conformance suite does not cover — FIFO
//! order, leader election, id generation, shared tables.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::mem::MemProvider;
use distlock_core::{Error, LeaseOptions, LostReason, Provider};
use futures::StreamExt;

const SLACK: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mutex_serves_waiters_in_arrival_order() {
    let locks = MemProvider::new();
    let lock = locks.fair_mutex("fifo").unwrap();
    let holder = lock.lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..6 {
        let lock = Arc::clone(&lock);
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // Let waiter i queue before waiter i + 1 arrives.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_try_lock_does_not_jump_the_queue() {
    let locks = MemProvider::new();
    let lock = locks.fair_mutex("queue").unwrap();
    let holder = lock.lock().await.unwrap();
    let waiting = {
        let lock = Arc::clone(&lock);
        tokio::spawn(async move { lock.lock().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    holder.release().await.unwrap();
    let next = waiting.await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_none());
    next.release().await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_some());
}

/// One name is one lock: the fair mutex waits for the mutex of its name
/// (and gets in after it), a read-write lock is refused.
#[tokio::test]
async fn fair_and_unfair_of_one_name_are_one_lock() {
    let locks = MemProvider::new();
    let a = locks.mutex("same").unwrap().lock().await.unwrap();
    let fair = locks.fair_mutex("same").unwrap();
    assert!(fair.try_lock().await.unwrap().is_none());
    let refused = locks.rw_lock("same").unwrap().write().try_lock().await;
    assert!(refused.is_err_and(|e| e.is_conflict()));
    a.release().await.unwrap();
    assert!(fair.try_lock().await.unwrap().is_some());
}

#[tokio::test]
async fn shared_tables_are_shared_and_private_ones_are_not() {
    let table = format!("t{}", test_support::unique_name("table"));
    let a = MemProvider::shared(&table);
    let b = MemProvider::shared(&table);
    let private = MemProvider::new();
    let g = a.mutex("x").unwrap().lock().await.unwrap();
    assert!(b.mutex("x").unwrap().try_lock().await.unwrap().is_none());
    assert!(private
        .mutex("x")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_some());
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_has_one_leader_at_a_time_and_hands_over() {
    let locks = MemProvider::new();
    let election = locks.election("leader").unwrap();
    let mut observed = election.observe();
    assert_eq!(observed.next().await.unwrap().unwrap(), None);
    // An observer that keeps up sees every leader in turn. (One that falls
    // behind sees the latest leader, not each one in between.)
    let observer = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(item) = observed.next().await {
            match item.unwrap() {
                Some(info) => seen.push((info.id, info.term)),
                None if seen.len() == 3 => break,
                None => {}
            }
        }
        seen
    });

    let first = election.campaign("node-1").await.unwrap();
    assert_eq!(first.candidate(), "node-1");
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut campaigns = Vec::new();
    for id in ["node-2", "node-3"] {
        let election = Arc::clone(&election);
        campaigns.push(tokio::spawn(
            async move { election.campaign(id).await.unwrap() },
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(election.leader().await.unwrap().unwrap().id, "node-1");
    let mut terms = vec![first.term()];
    first.resign().await.unwrap();

    let mut leaders = Vec::new();
    for c in campaigns {
        let leadership = c.await.unwrap();
        assert!(leadership.is_leader());
        assert_eq!(
            election.leader().await.unwrap().unwrap().id,
            leadership.candidate()
        );
        terms.push(leadership.term());
        leaders.push(leadership.candidate().to_owned());
        tokio::time::sleep(Duration::from_millis(50)).await;
        leadership.resign().await.unwrap();
    }
    assert_eq!(
        leaders,
        ["node-2", "node-3"],
        "candidates not served in order"
    );
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms {terms:?}");

    let seen = tokio::time::timeout(SLACK, observer)
        .await
        .unwrap()
        .unwrap();
    let expected: Vec<(String, u64)> = ["node-1", "node-2", "node-3"]
        .iter()
        .map(|s| (*s).to_owned())
        .zip(terms)
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(election.leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_lost_when_its_lease_runs_out_and_observers_see_it() {
    let locks = MemProvider::new();
    let lease = LeaseOptions::manual(Duration::from_millis(300)).unwrap();
    let election = locks
        .with_lease(lease)
        .unwrap()
        .election("expiring")
        .unwrap();
    let mut observed = election.observe();
    let leader = election.campaign("short").await.unwrap();
    assert_eq!(
        tokio::time::timeout(SLACK, leader.lost()).await.unwrap(),
        LostReason::Expired
    );
    assert!(!leader.is_leader());
    let mut last = None;
    while let Ok(Some(item)) = tokio::time::timeout(SLACK, observed.next()).await {
        last = Some(item.unwrap());
        if last == Some(None) && !leader.is_leader() {
            break;
        }
    }
    assert_eq!(last, Some(None), "observer never saw the leader go");
}

#[tokio::test]
async fn cancelled_campaign_withdraws() {
    let locks = MemProvider::new();
    let election = locks.election("withdraw").unwrap();
    let leader = election.campaign("a").await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(50), election.campaign("b")).await;
    assert!(r.is_err());
    leader.resign().await.unwrap();
    // "b" withdrew: "c" is next, not stuck behind a ghost.
    let c = tokio::time::timeout(SLACK, election.campaign("c"))
        .await
        .expect("stuck behind a cancelled candidate")
        .unwrap();
    assert_eq!(election.leader().await.unwrap().unwrap().id, "c");
    c.resign().await.unwrap();
}

#[tokio::test]
async fn bad_candidate_ids_are_typed_errors() {
    let locks = MemProvider::new();
    let election = locks.election("bad").unwrap();
    for bad in [String::new(), "a\nb".into(), "x".repeat(257)] {
        assert!(matches!(
            election.campaign(&bad).await,
            Err(Error::InvalidOptions(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_unique_and_increasing_per_generator() {
    let table = MemProvider::new();
    let clients: [Arc<dyn Provider>; 2] = [Arc::new(table.new_client()), Arc::new(table)];
    test_support::conformance::ids_unique_and_increasing(clients).await;
}

#[test]
fn acquiring_outside_a_runtime_is_an_error() {
    let locks = MemProvider::new();
    let lock = locks.mutex("no-runtime").unwrap();
    let r = futures::executor::block_on(lock.try_lock());
    assert!(matches!(r, Err(Error::NoRuntime)));
}

#[test]
fn arbitrary_names_ttls_and_timeouts_give_typed_errors() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let client: Arc<dyn Provider> = Arc::new(MemProvider::new());
    // The in-process table has nothing to inspect from outside: a rejected
    // name never reaches it.
    test_support::properties::check(rt.handle(), &client, "", |_| false);
}

/// A plain mutex waiting for a mutex holder is first in line for the
/// name: semaphore `try_lock`s refused meanwhile (they find the mutex
/// holding) never make that waiter fail when the holder releases. A plain
/// waiter is not queued and counts every queued waiter of another kind as
/// ahead of it, so a refused try must never be seen queued: it is decided
/// and refused under one table lock. Before, a try was queued under one
/// lock and refused under a second, and about 1 round in 15 the waiter was
/// refused with "in use by a semaphore" though no semaphore ever held
/// (rounds where the semaphore got in after the release, barging as a
/// plain mutex may, are not counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_waiter_is_not_refused_by_younger_refused_tries() {
    let p = MemProvider::new();
    let mut refused = Vec::new();
    let mut barged = 0;
    for round in 0..300 {
        let name = format!("review/plain-waiter-{round}");
        let held = p.mutex(&name).unwrap().lock().await.unwrap();
        let m = p.mutex(&name).unwrap();
        let waiter = tokio::spawn(async move { m.lock_timeout(Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        let stop = Arc::new(AtomicBool::new(false));
        let hammer = {
            let (p, name, stop) = (p.clone(), name.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let s = p.semaphore(&name, 1).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(g)) = s.try_lock().await {
                        return Some(g);
                    }
                }
                None
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        held.release().await.unwrap();
        let got = waiter.await.unwrap();
        stop.store(true, Ordering::Relaxed);
        let sem = hammer.await.unwrap();
        match got {
            Ok(Some(g)) => g.release().await.unwrap(),
            // The semaphore that got in after the release barged (the
            // plain mutex's rule, documented): not counted here.
            other if sem.is_none() => refused.push(format!("round {round}: {other:?}")),
            _ => barged += 1,
        }
    }
    eprintln!(
        "the semaphore barged in {barged} of 300 rounds; refused with nobody in: {}",
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "{} of 300: {:#?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );
}

/// `held_until` is the instant `lost()` fires at unless renewed: inside the
/// TTL less the drift margin, moved on by renewals, and where it stood once
/// the lease is lost (a process supervising a child bounds its grace by it).
#[tokio::test]
async fn held_until_is_the_deadline_lost_fires_at() {
    let ttl = Duration::from_millis(600);
    let locks = MemProvider::new();
    let lease = LeaseOptions::manual(ttl).unwrap();
    let before = std::time::Instant::now();
    let guard = locks
        .with_lease(lease)
        .unwrap()
        .mutex("deadline")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let until = guard.held_until().unwrap();
    let drift = distlock_core::lease::clock_drift(ttl);
    assert!(
        until <= before + ttl - drift + Duration::from_millis(50),
        "{:?}",
        until - before
    );
    assert!(until > std::time::Instant::now());
    let watch = guard.watch();
    assert_eq!(watch.held_until(), Some(until));
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.extend(ttl).await.unwrap();
    let moved = guard.held_until().unwrap();
    assert!(moved > until, "a renewal moves it on");
    let reason = guard.lost().await;
    assert_eq!(reason, LostReason::Expired);
    let lost_at = std::time::Instant::now();
    assert!(lost_at >= moved, "lost() fired {:?} early", moved - lost_at);
    assert_eq!(guard.held_until(), Some(moved));
}
