//! Inspect and force-release on Redis beyond the shared operations checks:
//! foreign holders (a hand-set key, a stale holder record, redis-py), the
//! `owner=` URL query and bad labels, data of another type under a name
//! (`Conflict`, nothing changed), force-release of a name nobody holds, the
//! evicted holder's token refused by a fenced resource, and the round trips
//! of an inspect with 64 waiters.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{
    Error, HoldRole, LeaseLeft, LeaseOptions, LostReason, PrimitiveKind, Provider,
};
use distlock_redis::{RedisOptions, RedisProvider};
use test_support::conformance::SLACK;
use test_support::redis::RedisServer;
use test_support::safety::{FencedStore, Stale};
use test_support::unique_name;

const FOREIGN: &str = "not distlock (redis-py or another client)";

async fn connect(url: &str) -> RedisProvider {
    RedisProvider::connect_with(url, RedisOptions::new())
        .await
        .unwrap()
}

fn lease() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(30)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_set_key_is_a_foreign_holder_and_a_stale_record_is_never_shown() {
    let redis = test_support::redis::shared();
    let client = connect(&redis.url()).await;
    for kind in [PrimitiveKind::Mutex, PrimitiveKind::FairMutex] {
        // Set by hand, with and without a TTL.
        let name = unique_name("foreign");
        assert_eq!(redis.cli(&["SET", &name, "by-hand", "PX", "20000"]), "OK");
        let snapshot = client.inspect(&name, kind).await.unwrap();
        assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
        let holder = &snapshot.holders[0];
        assert_eq!(holder.role, HoldRole::Exclusive);
        assert_eq!(holder.foreign.as_deref(), Some(FOREIGN));
        assert_eq!(
            (
                holder.owner.as_ref(),
                holder.fencing_token,
                holder.acquired_at
            ),
            (None, None, None)
        );
        assert!(
            matches!(holder.lease, LeaseLeft::Ttl(left) if left > Duration::from_secs(15) && left <= Duration::from_secs(20)),
            "{snapshot:?}"
        );
        assert_eq!(redis.cli(&["PERSIST", &name]), "1");
        let snapshot = client.inspect(&name, kind).await.unwrap();
        assert_eq!(
            snapshot.holders[0].lease,
            LeaseLeft::NoExpiry,
            "{snapshot:?}"
        );
        // Reading changed nothing.
        assert_eq!(redis.cli(&["GET", &name]), "by-hand");
    }

    // A distlock hold whose key another client overwrote (as after the lease
    // expired and redis-py took it): the record left is not shown as its
    // holder, and the token never appears in a snapshot.
    let name = unique_name("stale");
    let guard = client
        .with_lease(lease())
        .unwrap()
        .mutex(&name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .unwrap();
    let token = redis.cli(&["GET", &name]);
    let mine = client.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
    assert_eq!(mine.holders[0].owner.as_deref(), Some(client.owner()));
    assert!(!format!("{mine:?}").contains(&token), "{mine:?}");
    assert_eq!(
        redis.cli(&["SET", &name, "someone-else", "PX", "20000"]),
        "OK"
    );
    let theirs = client.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
    assert_eq!(theirs.holders.len(), 1, "{theirs:?}");
    assert_eq!(theirs.holders[0].foreign.as_deref(), Some(FOREIGN));
    assert_eq!(theirs.holders[0].fencing_token, None);
    // The guard finds out at its release.
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_py_holder_is_shown_as_foreign_and_force_release_evicts_it() {
    let redis = test_support::redis::shared();
    let url = redis.url();
    let client = connect(&url).await;
    let name = unique_name("py-ops");
    let key = client.lock_key(&name).unwrap();
    let holder = redis_py(&url, &key, &["hold", "3"]);
    let deadline = tokio::time::Instant::now() + test_support::PEER_START;
    while redis.cli(&["EXISTS", &key]) != "1" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "redis-py never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let snapshot = client.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
    assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
    assert_eq!(snapshot.holders[0].foreign.as_deref(), Some(FOREIGN));
    assert!(
        matches!(snapshot.holders[0].lease, LeaseLeft::Ttl(left) if left <= Duration::from_secs(30)),
        "{snapshot:?}"
    );
    // A distlock waiter, then the operator evicts redis-py.
    let lock = client.with_lease(lease()).unwrap().mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let done = client
        .force_release(&name, PrimitiveKind::Mutex)
        .await
        .unwrap();
    assert_eq!(done.evicted, 1, "{done:?}");
    let next = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter got in after the force-release");
    assert!(next.fencing_token() >= done.fence.unwrap());
    // redis-py's own release now finds the lock not its own.
    let out = tokio::task::spawn_blocking(move || holder.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success(), "redis-py released a lock it lost");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("LockNotOwnedError"), "{stderr}");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_label_comes_from_options_or_the_url_and_bad_labels_are_refused() {
    let redis = test_support::redis::shared();
    let base = distlock_core::inspect::owner_identity(None).unwrap();
    let labelled = RedisProvider::connect(&format!("{}?owner=billing-worker", redis.url()))
        .await
        .unwrap();
    assert_eq!(labelled.owner(), format!("billing-worker@{base}"));
    let plain = connect(&redis.url()).await;
    assert_eq!(plain.owner(), base);
    let coded =
        RedisProvider::connect_with(&redis.url(), RedisOptions::new().owner_label("eu/worker:7"))
            .await
            .unwrap();
    assert_eq!(coded.owner(), format!("eu/worker:7@{base}"));

    // The label is what every kind stores and shows (two names: one name
    // is one lock).
    let name = unique_name("owner");
    let other = unique_name("owner-rw");
    let sem = labelled
        .with_lease(lease())
        .unwrap()
        .semaphore(&name, 2)
        .unwrap();
    let permit = sem.try_lock().await.unwrap().unwrap();
    let writer = coded
        .with_lease(lease())
        .unwrap()
        .rw_lock(&other)
        .unwrap()
        .write();
    let w = writer.try_lock().await.unwrap().unwrap();
    let s = plain
        .inspect(&name, PrimitiveKind::Semaphore)
        .await
        .unwrap();
    assert_eq!(s.holders[0].owner.as_deref(), Some(labelled.owner()));
    let r = plain
        .inspect(&other, PrimitiveKind::ReadWrite)
        .await
        .unwrap();
    assert_eq!(r.holders[0].role, HoldRole::Write);
    assert_eq!(r.holders[0].owner.as_deref(), Some(coded.owner()));
    permit.release().await.unwrap();
    w.release().await.unwrap();

    for bad in ["x@y", "", "a%20b", &"l".repeat(65)] {
        let url = format!("{}?owner={bad}", redis.url());
        let e = RedisProvider::connect(&url).await.unwrap_err();
        assert!(matches!(e, Error::InvalidOptions(_)), "{bad:?}: {e:?}");
    }
    let e = RedisProvider::connect_with(&redis.url(), RedisOptions::new().owner_label("é"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOptions(_)), "{e:?}");
    let e = RedisProvider::connect(&format!("{}?owner=a&owner=b", redis.url()))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidUrl(_)), "{e:?}");
}

/// A kind, the key of a name to spoil, and the command that writes it
/// (the key's place left empty).
type Case = (PrimitiveKind, fn(&str) -> String, &'static [&'static str]);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_of_another_type_is_a_conflict_and_is_left_unchanged() {
    let redis = test_support::redis::shared();
    let client = connect(&redis.url()).await;
    let cases: [Case; 5] = [
        (
            PrimitiveKind::Mutex,
            |n| n.to_owned(),
            &["HSET", "", "f", "v"],
        ),
        (
            PrimitiveKind::FairMutex,
            |n| format!("{{{n}}}:fair:queue"),
            &["SET", "", "v"],
        ),
        (
            PrimitiveKind::ReadWrite,
            |n| format!("{{{n}}}:rw:readers"),
            &["SET", "", "v"],
        ),
        (
            PrimitiveKind::Semaphore,
            |n| format!("{{{n}}}:sem:holders"),
            &["RPUSH", "", "v"],
        ),
        (
            PrimitiveKind::Election,
            |n| format!("{{{n}}}:elect:leader"),
            &["RPUSH", "", "v"],
        ),
    ];
    for (kind, key_of, write) in cases {
        let name = unique_name("conflict");
        let key = key_of(&name);
        let mut args: Vec<&str> = write.to_vec();
        args[1] = &key;
        let _ = redis.cli(&args);
        let dump = redis.cli(&["DUMP", &key]);
        let e = client.inspect(&name, kind).await.unwrap_err();
        assert!(
            matches!(&e, Error::Conflict { what, .. } if what.contains(&key)),
            "{kind}: {e:?}"
        );
        let e = client.force_release(&name, kind).await.unwrap_err();
        assert!(matches!(e, Error::Conflict { .. }), "{kind}: {e:?}");
        assert_eq!(redis.cli(&["DUMP", &key]), dump, "{kind}: changed");
        assert_eq!(redis.cli(&["PTTL", &key]), "-1", "{kind}");
    }
    // Bad names are typed errors.
    for kind in PrimitiveKind::ALL {
        assert!(matches!(
            client.inspect("", kind).await,
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            client.force_release("", kind).await,
            Err(Error::InvalidName { .. })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_name_nobody_holds_evicts_nothing_and_creates_nothing() {
    let redis = test_support::redis::shared();
    let client = connect(&redis.url()).await;
    for kind in PrimitiveKind::ALL {
        let name = unique_name("nobody");
        let first = client.force_release(&name, kind).await.unwrap();
        assert_eq!(first.evicted, 0, "{kind}: {first:?}");
        let second = client.force_release(&name, kind).await.unwrap();
        assert_eq!(second.evicted, 0, "{kind}: {second:?}");
        // Nothing left behind: an operation on a name that does not exist
        // changes nothing (a fencing counter was created and advanced).
        assert_eq!((first.fence, second.fence), (None, None), "{kind}");
        let keys = redis.cli(&["KEYS", &format!("*{name}*")]);
        assert!(keys.is_empty(), "{kind}: {keys}");
        let snapshot = client.inspect(&name, kind).await.unwrap();
        assert!(!snapshot.is_held(), "{kind}: {snapshot:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evicted_holders_token_is_refused_by_a_fenced_resource() {
    let redis = test_support::redis::shared();
    let client = connect(&redis.url()).await;
    let operator = connect(&redis.url()).await;
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
    ] {
        let name = unique_name("fenced");
        let open = || match kind {
            PrimitiveKind::Mutex => client.with_lease(lease()).and_then(|p| p.mutex(&name)),
            PrimitiveKind::FairMutex => {
                client.with_lease(lease()).and_then(|p| p.fair_mutex(&name))
            }
            PrimitiveKind::ReadWrite => client
                .with_lease(lease())
                .and_then(|p| p.rw_lock(&name))
                .map(|rw| rw.write()),
            _ => client
                .with_lease(lease())
                .and_then(|p| p.semaphore(&name, 1))
                .map(|s| s as Arc<dyn distlock_core::Lock>),
        };
        let store = FencedStore::default();
        // A short lease: renewed every second, so the eviction is noticed
        // within a second.
        let short = LeaseOptions::new(Duration::from_secs(3)).unwrap();
        let evicted = match kind {
            PrimitiveKind::Mutex => client.with_lease(short).and_then(|p| p.mutex(&name)),
            PrimitiveKind::FairMutex => client.with_lease(short).and_then(|p| p.fair_mutex(&name)),
            PrimitiveKind::ReadWrite => client
                .with_lease(short)
                .and_then(|p| p.rw_lock(&name))
                .map(|rw| rw.write()),
            _ => client
                .with_lease(short)
                .and_then(|p| p.semaphore(&name, 1))
                .map(|s| s as Arc<dyn distlock_core::Lock>),
        }
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .unwrap();
        store.write(evicted.fencing_token(), 1).unwrap();
        let done = operator.force_release(&name, kind).await.unwrap();
        assert_eq!(done.evicted, 1, "{kind}");
        // The next holder writes; the evicted holder, still believing it
        // holds (its next renewal is seconds away), is refused.
        let next = open().unwrap().try_lock().await.unwrap().expect("free");
        assert!(evicted.is_held(), "{kind}: not told yet");
        store.write(next.fencing_token(), 2).unwrap();
        assert_eq!(
            store.write(evicted.fencing_token(), 3),
            Err(Stale),
            "{kind}"
        );
        assert_eq!(store.snapshot(), (2, 2), "{kind}");
        // Handed the fence at once, a resource refuses the evicted token
        // even before anyone else wrote.
        let fresh = FencedStore::default();
        fresh.read(done.fence.unwrap()).unwrap();
        assert_eq!(fresh.write(evicted.fencing_token(), 3), Err(Stale));
        // Its next renewal finds the hold taken.
        let reason = tokio::time::timeout(Duration::from_secs(1) + SLACK, evicted.lost())
            .await
            .unwrap_or_else(|_| panic!("{kind}: lost() never fired"));
        assert_eq!(reason, LostReason::Taken, "{kind}");
        next.release().await.unwrap();
    }
}

/// The holder records and waiters' owners go with their holds and waiters:
/// after a queued hand-over and the releases, only the fencing counters are
/// left of a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_records_and_waiters_owners_leave_nothing_behind() {
    let redis = test_support::redis::shared();
    let a = connect(&redis.url()).await;
    let b = connect(&redis.url()).await;
    let name = unique_name("tidy");
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
    ] {
        let open = |p: &RedisProvider| match kind {
            PrimitiveKind::Mutex => p.with_lease(lease()).and_then(|p| p.mutex(&name)),
            PrimitiveKind::FairMutex => p.with_lease(lease()).and_then(|p| p.fair_mutex(&name)),
            PrimitiveKind::ReadWrite => p
                .with_lease(lease())
                .and_then(|p| p.rw_lock(&name))
                .map(|rw| rw.read()),
            _ => p
                .with_lease(lease())
                .and_then(|p| p.semaphore(&name, 1))
                .map(|s| s as Arc<dyn distlock_core::Lock>),
        };
        let first = open(&a).unwrap().try_lock().await.unwrap().unwrap();
        let second = match kind {
            // A writer queues behind the reader.
            PrimitiveKind::ReadWrite => b
                .with_lease(lease())
                .unwrap()
                .rw_lock(&name)
                .unwrap()
                .write(),
            _ => open(&b).unwrap(),
        };
        let task = tokio::spawn(async move { second.lock_timeout(SLACK).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        first.release().await.unwrap();
        let next = task.await.unwrap().unwrap().expect("handed over");
        next.release().await.unwrap();
    }
    let mut left: Vec<String> = redis
        .cli(&["KEYS", &format!("*{name}*")])
        .lines()
        .map(str::to_owned)
        .filter(|k| !k.is_empty())
        .collect();
    left.sort();
    let brace = format!("{{{name}}}");
    assert_eq!(
        left,
        vec![
            format!("{brace}:fence"),
            format!("{brace}:rw:fence"),
            format!("{brace}:sem:fence"),
        ]
    );
}

/// `INFO commandstats` as command -> calls.
fn command_calls(redis: &RedisServer) -> HashMap<String, u64> {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The report's measurement: an inspect of a name with 64 queued waiters is
/// one round trip (one `EVALSHA`), counted with `INFO commandstats` on a
/// server of its own (the waiters re-check every 20 s, so they send nothing
/// while it is measured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_with_64_waiters_is_one_round_trip() {
    let redis = RedisServer::start();
    let quiet = RedisOptions::new().recheck_interval(Duration::from_secs(20));
    let waiters = RedisProvider::connect_with(&redis.url(), quiet)
        .await
        .unwrap();
    let reader = connect(&redis.url()).await;
    for kind in [
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
    ] {
        let name = unique_name("rt");
        let open = |p: &RedisProvider| match kind {
            PrimitiveKind::FairMutex => p.with_lease(lease()).and_then(|p| p.fair_mutex(&name)),
            PrimitiveKind::ReadWrite => p
                .with_lease(lease())
                .and_then(|p| p.rw_lock(&name))
                .map(|rw| rw.write()),
            _ => p
                .with_lease(lease())
                .and_then(|p| p.semaphore(&name, 1))
                .map(|s| s as Arc<dyn distlock_core::Lock>),
        };
        let held = open(&reader).unwrap().try_lock().await.unwrap().unwrap();
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let lock = open(&waiters).unwrap();
            tasks.push(tokio::spawn(async move { lock.lock().await }));
        }
        let deadline = tokio::time::Instant::now() + SLACK * 2;
        loop {
            let s = reader.inspect(&name, kind).await.unwrap();
            if s.waiters.count == 64 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{kind}: {s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the waiters settle into their sleep (subscribe, re-attempt).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = command_calls(&redis);
        let snapshot = reader.inspect(&name, kind).await.unwrap();
        let after = command_calls(&redis);
        assert_eq!(snapshot.waiters.count, 64, "{kind}");
        assert_eq!(snapshot.waiters.owners.len(), 64, "{kind}");
        assert_eq!(snapshot.holders.len(), 1, "{kind}");
        let delta = |c: &str| after.get(c).unwrap_or(&0) - before.get(c).unwrap_or(&0);
        let inner: u64 = after
            .keys()
            .filter(|c| !matches!(c.as_str(), "evalsha" | "eval" | "info"))
            .map(|c| delta(c))
            .sum();
        eprintln!(
            "inspect {kind} with 64 waiters: {} EVALSHA, {} EVAL (round trips), {inner} commands inside the script",
            delta("evalsha"),
            delta("eval")
        );
        assert_eq!(delta("evalsha") + delta("eval"), 1, "{kind}: {after:?}");
        held.release().await.unwrap();
        for task in tasks {
            task.abort();
        }
        // The aborted waiters leave the queue in the background.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
