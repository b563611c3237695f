//! Operations on ZooKeeper beyond the shared checks: foreign (Curator,
//! LeaderLatch-style) holders shown as such, the owner label from options
//! and the URL, inspect of an id counter, force-release of a free name, the
//! evicted holder's token refused by a fenced resource, and the number of
//! requests an inspect of 64 waiters sends.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::inspect::owner_identity;
use distlock_core::{
    Error, HoldRole, LeaseLeft, Lock, LostReason, PrimitiveKind, Provider, Snapshot,
};
use distlock_zk::zookeeper_client::{self, CreateMode};
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::safety::{FencedStore, Stale};
use test_support::unique_name;
use tokio::time::Instant;

const SLACK: Duration = Duration::from_secs(5);

fn hosts() -> String {
    test_support::zookeeper::shared().connect_string()
}

async fn provider() -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts()))
        .await
        .unwrap()
}

async fn inspect_until(
    p: &ZkProvider,
    name: &str,
    kind: PrimitiveKind,
    limit: Duration,
    done: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let deadline = Instant::now() + limit;
    loop {
        let s = p.inspect(name, kind).await.unwrap();
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "never came: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_holder_is_foreign_and_force_release_lets_distlock_in() {
    let hosts = hosts();
    let ours = provider().await;
    let name = unique_name("curator-ops");
    let path = ours.path(&name).unwrap();
    let mut curator = test_support::curator::spawn("CuratorPeer", &hosts, &path, &["hold", "60"]);
    // JVM start-up: wait for Curator's node.
    let snapshot = inspect_until(
        &ours,
        &name,
        PrimitiveKind::FairMutex,
        Duration::from_secs(30),
        Snapshot::is_held,
    )
    .await;
    let holder = &snapshot.holders[0];
    assert_eq!(holder.role, HoldRole::Exclusive);
    assert_eq!(holder.owner, None, "{snapshot:?}");
    let foreign = holder.foreign.as_deref().expect("foreign");
    // Curator's InterProcessMutex node, its data the client's IP address.
    assert!(
        foreign.starts_with("lock node _c_") && foreign.contains("-lock-"),
        "{foreign}"
    );
    assert!(foreign.contains("data \""), "{foreign}");
    assert!(matches!(holder.lease, LeaseLeft::Session { session_id } if session_id != 0));
    assert!(holder.fencing_token.is_some() && holder.acquired_at.is_some());

    // A distlock waiter queues behind it, with its identity.
    let lock = ours.fair_mutex(&name).unwrap();
    let waiting = tokio::spawn(async move { lock.lock().await });
    let snapshot = inspect_until(&ours, &name, PrimitiveKind::FairMutex, SLACK, |s| {
        s.waiters.count == 1
    })
    .await;
    assert_eq!(snapshot.waiters.owners, vec![ours.owner().to_owned()]);
    assert!(snapshot.holders[0].foreign.is_some());

    // The operator evicts Curator: the distlock waiter gets in.
    let done = ours
        .force_release(&name, PrimitiveKind::FairMutex)
        .await
        .unwrap();
    assert_eq!((done.evicted, done.fence), (1, None));
    let guard = tokio::time::timeout(SLACK, waiting)
        .await
        .expect("the waiter got in")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > holder.fencing_token.unwrap());
    guard.release().await.unwrap();
    let _ = curator.kill();
    let _ = curator.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_latch_style_candidate_is_a_foreign_leader() {
    let ours = provider().await;
    let name = unique_name("latch-ops");
    let dir = ours.path(&name).unwrap();
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    raw.mkdir(
        &dir,
        &CreateMode::Container.with_acls(zookeeper_client::Acls::anyone_all()),
    )
    .await
    .unwrap();
    // What Curator's LeaderLatch creates: a protected ephemeral sequential
    // `latch-` node holding the participant id.
    let (stat, _) = raw
        .create(
            &format!("{dir}/_c_5e0c1a2b-0000-4000-8000-00000000abcd-latch-"),
            b"peer-1",
            &CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let election = ours.election(&name).unwrap();
    let campaign = tokio::spawn(async move { election.campaign("node-b").await });
    let snapshot = inspect_until(&ours, &name, PrimitiveKind::Election, SLACK, |s| {
        s.waiters.count == 1
    })
    .await;
    let leader = snapshot.leader.clone().expect("a leader");
    assert_eq!(leader.id, "peer-1");
    assert_eq!(leader.term, u64::try_from(stat.czxid).unwrap());
    let holder = &snapshot.holders[0];
    assert_eq!(holder.role, HoldRole::Leader);
    assert_eq!(holder.owner, None);
    assert!(
        holder
            .foreign
            .as_deref()
            .unwrap()
            .contains("data \"peer-1\""),
        "{snapshot:?}"
    );
    assert_eq!(snapshot.waiters.owners, vec![ours.owner().to_owned()]);
    // Force-release makes the distlock candidate leader.
    let done = ours
        .force_release(&name, PrimitiveKind::Election)
        .await
        .unwrap();
    assert_eq!(done.evicted, 1);
    let leadership = tokio::time::timeout(SLACK, campaign)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let snapshot = ours.inspect(&name, PrimitiveKind::Election).await.unwrap();
    assert_eq!(snapshot.leader.unwrap().id, "node-b");
    assert_eq!(snapshot.holders[0].owner.as_deref(), Some(ours.owner()));
    assert_eq!(snapshot.holders[0].fencing_token, Some(leadership.term()));
    leadership.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_label_comes_from_the_url_or_the_options_and_bad_ones_are_refused() {
    let hosts = hosts();
    let base = owner_identity(None).unwrap();
    let labelled = ZkProvider::connect(&format!("zk://{hosts}?owner=billing/eu-1:7"))
        .await
        .unwrap();
    assert_eq!(labelled.owner(), format!("billing/eu-1:7@{base}"));
    let plain = provider().await;
    assert_eq!(plain.owner(), base);
    let by_options = ZkProvider::connect_with(ZkOptions::new(&hosts).owner_label("worker_2"))
        .await
        .unwrap();
    assert_eq!(by_options.owner(), format!("worker_2@{base}"));

    // Stored with every kind of hold, read back by another provider (a
    // name per kind: one name is one lock).
    let name = unique_name("owner");
    let named = |kind: PrimitiveKind| format!("{name}-{kind}");
    let mutex = labelled
        .mutex(&named(PrimitiveKind::Mutex))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let fair = labelled
        .fair_mutex(&named(PrimitiveKind::FairMutex))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let read = labelled
        .rw_lock(&named(PrimitiveKind::ReadWrite))
        .unwrap()
        .read()
        .lock()
        .await
        .unwrap();
    let permit = labelled
        .semaphore(&named(PrimitiveKind::Semaphore), 2)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let leader = labelled
        .election(&named(PrimitiveKind::Election))
        .unwrap()
        .campaign("c-1")
        .await
        .unwrap();
    for kind in PrimitiveKind::ALL {
        let s = plain.inspect(&named(kind), kind).await.unwrap();
        assert_eq!(s.holders.len(), 1, "{kind}: {s:?}");
        assert_eq!(
            s.holders[0].owner.as_deref(),
            Some(labelled.owner()),
            "{kind}: {s:?}"
        );
        assert_eq!(s.holders[0].foreign, None, "{kind}");
    }
    assert_eq!(
        plain
            .inspect(&named(PrimitiveKind::Semaphore), PrimitiveKind::Semaphore)
            .await
            .unwrap()
            .permits,
        Some(2)
    );
    for g in [mutex, fair, read, permit] {
        g.release().await.unwrap();
    }
    leader.resign().await.unwrap();

    for url in [
        format!("zk://{hosts}?owner="),
        format!("zk://{hosts}?owner=a@b"),
        format!("zk://{hosts}?owner=a%20b"),
        format!("zk://{hosts}?owner={}", "x".repeat(65)),
    ] {
        assert!(
            matches!(ZkOptions::from_url(&url), Err(Error::InvalidOptions(_))),
            "{url}"
        );
    }
    assert!(matches!(
        ZkOptions::from_url(&format!("zk://{hosts}?owner=a&owner=b")),
        Err(Error::InvalidUrl(_))
    ));
    assert!(matches!(
        ZkProvider::connect_with(ZkOptions::new(&hosts).owner_label("two words")).await,
        Err(Error::InvalidOptions(_))
    ));
}

/// An id generator `a` made first keeps counting while locks `a/…` below
/// it come and go (its persistent counter node is their parent). Made while
/// a lock `a/b` exists, it is refused: `a` is then the lock's container
/// directory, which the server may delete with a counter in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_generator_and_the_locks_below_its_name() {
    let p = provider().await;
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();

    // The counter first.
    let a = unique_name("ids-above");
    let ids = p.id_generator(&a, 1).unwrap();
    let first = ids.next().await.unwrap();
    let below = p
        .mutex(&format!("{a}/b"))
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    let below = below.expect("the lock a/b is free");
    let fair = p
        .fair_mutex(&format!("{a}/c"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    assert_eq!(ids.next().await.unwrap(), first + 1, "while a/b is held");
    below.release().await.unwrap();
    fair.release().await.unwrap();
    assert_eq!(
        ids.next().await.unwrap(),
        first + 2,
        "after a/b was released"
    );
    let (data, stat) = raw.get_data(&p.path(&a).unwrap()).await.unwrap();
    assert_eq!(data, (first + 2).to_be_bytes());
    assert_eq!(stat.ephemeral_owner, 0, "the counter is persistent");

    // The lock first: refused, and its directory is left as it was.
    let c = unique_name("ids-below");
    let held = p
        .mutex(&format!("{c}/b"))
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    let held = held.expect("the lock c/b is free");
    let r = p.id_generator(&c, 1).unwrap().next().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    let (data, stat) = raw.get_data(&p.path(&c).unwrap()).await.unwrap();
    assert!(data.is_empty(), "the container was written: {data:?}");
    assert_eq!(stat.version, 0);
    assert!(held.is_held());
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_counter_is_a_conflict_for_inspect_and_force_release_and_stays() {
    let p = provider().await;
    let name = unique_name("ids-ops");
    let ids = p.id_generator(&name, 1).unwrap();
    let first = ids.next().await.unwrap();
    for kind in PrimitiveKind::ALL {
        let e = p.inspect(&name, kind).await.unwrap_err();
        assert!(matches!(e, Error::Conflict { .. }), "{kind}: {e:?}");
        let e = p.force_release(&name, kind).await.unwrap_err();
        assert!(matches!(e, Error::Conflict { .. }), "{kind}: {e:?}");
    }
    // Unchanged: the counter goes on.
    let again = p.id_generator(&name, 1).unwrap();
    assert_eq!(again.next().await.unwrap(), first + 1);
    for bad in ["", "a//b", "/x"] {
        for kind in PrimitiveKind::ALL {
            assert!(matches!(
                p.inspect(bad, kind).await,
                Err(Error::InvalidName { .. })
            ));
            assert!(matches!(
                p.force_release(bad, kind).await,
                Err(Error::InvalidName { .. })
            ));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_free_name_evicts_nothing() {
    let p = provider().await;
    let name = unique_name("free");
    for kind in PrimitiveKind::ALL {
        // Never used, then used and released (the directory is there).
        let done = p.force_release(&name, kind).await.unwrap();
        assert_eq!((done.evicted, done.fence), (0, None), "{kind}");
    }
    let g = p.fair_mutex(&name).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    let g = p.semaphore(&name, 1).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    for kind in PrimitiveKind::ALL {
        let done = p.force_release(&name, kind).await.unwrap();
        assert_eq!(done.evicted, 0, "{kind}");
        assert!(!p.inspect(&name, kind).await.unwrap().is_held(), "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evicted_holders_token_is_refused_after_the_next_holder_wrote() {
    let holder = provider().await;
    let waiter = provider().await;
    let operator = provider().await;
    for kind in [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
    ] {
        let name = unique_name("fenced");
        let open = |p: &ZkProvider| -> Arc<dyn Lock> {
            match kind {
                PrimitiveKind::Mutex => p.mutex(&name).unwrap(),
                PrimitiveKind::FairMutex => p.fair_mutex(&name).unwrap(),
                PrimitiveKind::ReadWrite => p.rw_lock(&name).unwrap().write(),
                _ => p.semaphore(&name, 1).unwrap(),
            }
        };
        let store = FencedStore::default();
        let evicted = open(&holder).lock().await.unwrap();
        store.write(evicted.fencing_token(), 1).unwrap();
        let lock = open(&waiter);
        let task = tokio::spawn(async move { lock.lock().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let done = operator.force_release(&name, kind).await.unwrap();
        assert_eq!(done.evicted, 1, "{kind}");
        let next = tokio::time::timeout(SLACK, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        store.write(next.fencing_token(), 2).unwrap();
        assert_eq!(
            store.write(evicted.fencing_token(), 3),
            Err(Stale),
            "{kind}"
        );
        assert_eq!(store.snapshot(), (2, 2));
        // Its node watch saw the deletion.
        let reason = tokio::time::timeout(SLACK, evicted.lost()).await.unwrap();
        assert_eq!(reason, LostReason::Deleted, "{kind}");
        assert!(evicted.release().await.is_err(), "{kind}");
        next.release().await.unwrap();
    }
}

/// The requests ZooKeeper has received on the connection of `session`
/// (four-letter word `cons`: `recved=` of the line with `sid=0x…`).
fn received(session: i64) -> u64 {
    let addr = test_support::zookeeper::shared().addr(0);
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"cons").unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).unwrap();
    #[allow(clippy::cast_sign_loss)]
    let sid = format!("sid=0x{:x},", session as u64);
    let line = out
        .lines()
        .find(|l| l.contains(&sid))
        .unwrap_or_else(|| panic!("{sid} not in {out}"));
    let recved = line.split("recved=").nth(1).unwrap();
    recved.split(',').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_of_64_waiters_sends_three_requests() {
    const WAITERS: usize = 64;
    let holder = provider().await;
    let waiters = provider().await;
    let reader = provider().await;
    let name = unique_name("inspect-64");
    let guard = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let lock = waiters.fair_mutex(&name).unwrap();
        tasks.push(tokio::spawn(async move {
            lock.lock().await.unwrap().release().await.unwrap();
        }));
    }
    inspect_until(&reader, &name, PrimitiveKind::FairMutex, SLACK * 2, |s| {
        s.waiters.count == WAITERS
    })
    .await;
    let session = reader.session_id().await.unwrap();
    // A session ping may fall between the two counts: the fewest of a few
    // tries is the inspect's own.
    let mut fewest = u64::MAX;
    for _ in 0..3 {
        let before = received(session);
        let s = reader
            .inspect(&name, PrimitiveKind::FairMutex)
            .await
            .unwrap();
        let after = received(session);
        assert_eq!(s.waiters.count, WAITERS);
        assert_eq!(s.waiters.owners.len(), WAITERS);
        fewest = fewest.min(after - before);
    }
    println!("inspect of a fair mutex with {WAITERS} waiters: {fewest} requests");
    assert_eq!(
        fewest, 3,
        "a sync, one multi-read for the listing, one for the nodes"
    );
    guard.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(SLACK * 2, t).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_distlock_leader_ends_its_term_and_elects_the_next() {
    let a = provider().await;
    let b = provider().await;
    let name = unique_name("evict-leader");
    let leader = a.election(&name).unwrap().campaign("a").await.unwrap();
    let election = b.election(&name).unwrap();
    let next = tokio::spawn(async move { election.campaign("b").await });
    inspect_until(&b, &name, PrimitiveKind::Election, SLACK, |s| {
        s.waiters.count == 1
    })
    .await;
    let done = b
        .force_release(&name, PrimitiveKind::Election)
        .await
        .unwrap();
    assert_eq!((done.evicted, done.fence), (1, None));
    let reason = tokio::time::timeout(SLACK, leader.lost()).await.unwrap();
    assert_eq!(reason, LostReason::Deleted);
    assert!(!leader.is_leader());
    let next = tokio::time::timeout(SLACK, next)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.term() > leader.term());
    let s = a.inspect(&name, PrimitiveKind::Election).await.unwrap();
    assert_eq!(
        s.leader.map(|l| (l.id, l.term)),
        Some(("b".into(), next.term()))
    );
    next.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_lock_and_release_costs_the_fewest_requests() {
    let client = provider().await;
    let session = client.session_id().await.unwrap();
    for (kind, most, held) in [
        // create and list (pipelined, one round trip: the list is the kind
        // check's, see `kinds.rs`), the watch on our own node (at once: the
        // path is shared), delete (at version 0: no read); it was 5 with the
        // read before the delete and the watch's removal, 3 before the kind
        // check. Held past 20 ms, one more: the children watch that hears
        // a request to release at once (a request is a node beside ours).
        (PrimitiveKind::Mutex, 4, 5),
        // create and list (pipelined), delete: a hold this short sets no
        // node watch (a queue node's path is never used again), a longer
        // one does
        (PrimitiveKind::FairMutex, 3, 4),
    ] {
        let name = unique_name("requests");
        let lock = match kind {
            PrimitiveKind::Mutex => client.mutex(&name),
            _ => client.fair_mutex(&name),
        }
        .unwrap();
        // The lock's directory exists from the first round on.
        lock.lock().await.unwrap().release().await.unwrap();
        // The fewest of a few tries: a session ping may fall in between.
        let mut fewest = u64::MAX;
        for _ in 0..5 {
            let before = received(session);
            lock.lock().await.unwrap().release().await.unwrap();
            // The node watch's request leaves from a task of its own.
            tokio::time::sleep(Duration::from_millis(100)).await;
            fewest = fewest.min(received(session) - before);
        }
        println!("{kind}: lock + release = {fewest} requests");
        assert!(fewest <= most, "{kind}: {fewest} requests, at most {most}");
        // Held long enough for the node watch, and no request to remove
        // the watch (the release's delete fires it).
        let mut fewest = u64::MAX;
        for _ in 0..5 {
            let before = received(session);
            let guard = lock.lock().await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            guard.release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            fewest = fewest.min(received(session) - before);
        }
        println!("{kind}: lock, hold 150 ms, release = {fewest} requests");
        assert!(fewest <= held, "{kind}: {fewest} requests, at most {held}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfair_holder_evicted_and_replaced_at_once_is_lost_and_leaves_the_new_node() {
    // The unfair mutex's path is shared: force-released just after it was
    // taken, the next waiter creates the path again at once. The evicted
    // holder must see that the node there is not its own, and its release
    // must not delete the new holder's node.
    let a = provider().await;
    let b = provider().await;
    let admin = provider().await;
    for _ in 0..5 {
        let name = unique_name("unfair-replaced");
        let first = a.mutex(&name).unwrap().lock().await.unwrap();
        // Within a few milliseconds of the acquisition: evicted, and the
        // path taken again by another client.
        admin
            .force_release(&name, PrimitiveKind::Mutex)
            .await
            .unwrap();
        let second = b
            .mutex(&name)
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .expect("the path was free after the force-release");
        let reason = tokio::time::timeout(SLACK, first.lost())
            .await
            .expect("the evicted holder never learned it lost the lock");
        assert_eq!(reason, LostReason::Deleted);
        assert!(first.release().await.is_err(), "released a lost lease");
        let s = admin.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
        assert_eq!(
            s.holders.first().and_then(|h| h.fencing_token),
            Some(second.fencing_token()),
            "the new holder's node is gone"
        );
        assert!(second.is_held(), "the new holder lost its lease");
        second.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_early_or_late_in_a_hold_fires_lost() {
    // The node watch is set 20 ms into a hold: a deletion before that is
    // seen by the watch's first read, one after it by the watch.
    let client = provider().await;
    let admin = provider().await;
    for delay in [Duration::ZERO, Duration::from_millis(300)] {
        let name = unique_name("deleted");
        let guard = client.mutex(&name).unwrap().lock().await.unwrap();
        tokio::time::sleep(delay).await;
        let done = admin
            .force_release(&name, PrimitiveKind::Mutex)
            .await
            .unwrap();
        assert_eq!(done.evicted, 1);
        let reason = tokio::time::timeout(SLACK, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("no lost() after a deletion {delay:?} into the hold"));
        assert_eq!(reason, LostReason::Deleted);
        assert!(guard.release().await.is_err(), "released a lost lease");
    }
}

/// The unfair mutex's hold is asked through a node named by its `czxid`:
/// the holder hears it at once (a children watch, not only its session
/// check), and makes the node its own, so the request outlives the asking
/// provider (a `distlock unlock` that exits) and `inspect` keeps showing
/// it; the holder's release takes the node away, and the next holder is
/// not asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfair_request_outlives_its_asker_and_goes_with_the_hold() {
    let holder = provider().await;
    let viewer = provider().await;
    let name = unique_name("unfair-asked");
    let guard = holder.mutex(&name).unwrap().lock().await.unwrap();
    // Past the first 20 ms of the hold, when the children watch is set.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asker = provider().await;
    let asked = asker
        .request_release(&name, PrimitiveKind::Mutex)
        .await
        .unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    // Well within one session check (session timeout / 4).
    let check = holder.session_timeout().await.unwrap() / 4;
    tokio::time::timeout(check, guard.release_requested())
        .await
        .expect("heard before the next session check");
    // The holder's session owns the request node: the asker can go.
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let dir = holder.path(&name).unwrap();
    let request = format!("{dir}/_unfair_lock-asked-{}", guard.fencing_token());
    let deadline = Instant::now() + SLACK;
    loop {
        let stat = raw.check_stat(&request).await.unwrap();
        let owner = stat.map(|s| s.ephemeral_owner);
        if owner == Some(holder.session_id().await.unwrap()) {
            break;
        }
        assert!(Instant::now() < deadline, "never adopted: {owner:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    asker.close().await.unwrap();
    let snapshot = viewer.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
    assert!(snapshot.holders[0].release_requested, "{snapshot:?}");
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let deadline = Instant::now() + SLACK;
    while raw.check_stat(&request).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the request outlived the hold");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = viewer.mutex(&name).unwrap().try_lock().await.unwrap();
    let next = next.expect("free after the release");
    let snapshot = viewer.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
    assert!(!snapshot.holders[0].release_requested, "{snapshot:?}");
    next.release().await.unwrap();
}

/// The request nodes (`_unfair_lock-asked-…`) in `dir`.
async fn requests_in(raw: &zookeeper_client::Client, dir: &str) -> Vec<String> {
    match raw.list_children(dir).await {
        Ok(children) => children
            .into_iter()
            .filter(|c| c.starts_with("_unfair_lock-asked-"))
            .collect(),
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("{e}"),
    }
}

/// An asker that closes its session as soon as `request_release` returned
/// (as `distlock unlock` does): the holder still hears the request, also
/// when it was asked before its children watch was set (the first 20 ms
/// of the hold), and the request stays shown after the asker is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfair_request_from_an_asker_that_exits_at_once_is_heard() {
    let holder = provider().await;
    let viewer = provider().await;
    for i in 0..30u64 {
        let name = unique_name("asker-exits");
        let guard = holder.mutex(&name).unwrap().lock().await.unwrap();
        // Before, around and after the holder's watch is set.
        tokio::time::sleep(Duration::from_millis(i % 3 * 20)).await;
        let asker = provider().await;
        let asked = asker
            .request_release(&name, PrimitiveKind::Mutex)
            .await
            .unwrap();
        assert_eq!(asked.len(), 1, "{i}: {asked:?}");
        asker.close().await.unwrap();
        drop(asker);
        let heard = tokio::time::timeout(SLACK, guard.release_requested()).await;
        assert!(heard.is_ok(), "{i}: the request was never heard");
        let snapshot = viewer.inspect(&name, PrimitiveKind::Mutex).await.unwrap();
        assert!(snapshot.holders[0].release_requested, "{i}: {snapshot:?}");
        guard.release().await.unwrap();
    }
}

/// A hold that ends before its holder heard the request: once
/// `request_release` has returned, no request node stays behind, while the
/// asker's session goes on (a long-lived operator process would otherwise
/// collect one per such request, and keep the directory from being
/// reaped). Such a hold let go by itself, and is not returned as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfair_request_to_a_hold_that_ends_first_leaves_nothing() {
    let holder = provider().await;
    let asker = provider().await;
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();

    // A distlock holder that lets go at once, before its watch is set.
    for i in 0..20u64 {
        let name = unique_name("asked-gone");
        let dir = holder.path(&name).unwrap();
        let guard = holder.mutex(&name).unwrap().lock().await.unwrap();
        let asking = {
            let asker = asker.clone();
            let name = name.clone();
            tokio::spawn(async move { asker.request_release(&name, PrimitiveKind::Mutex).await })
        };
        tokio::time::sleep(Duration::from_millis(i % 4)).await;
        guard.release().await.unwrap();
        let asked = asking.await.unwrap().unwrap();
        assert!(asked.len() <= 1, "{asked:?}");
        let deadline = Instant::now() + SLACK;
        loop {
            let left = requests_in(&raw, &dir).await;
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "{i}: left behind: {left:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // A holder that never takes a request over (a distlock version that
    // does not, here a plain client): released while the asker waits.
    let name = unique_name("asked-gone-raw");
    let dir = holder.path(&name).unwrap();
    let open = zookeeper_client::Acls::anyone_all();
    raw.mkdir(&dir, &CreateMode::Container.with_acls(open))
        .await
        .unwrap();
    let unfair = format!("{dir}/_unfair_lock");
    let theirs = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    theirs
        .create(
            &unfair,
            b"distlock owner=old@h:1 id=x",
            &CreateMode::Ephemeral.with_acls(open),
        )
        .await
        .unwrap();
    let asking = {
        let asker = asker.clone();
        let name = name.clone();
        tokio::spawn(async move { asker.request_release(&name, PrimitiveKind::Mutex).await })
    };
    let deadline = Instant::now() + SLACK;
    while requests_in(&raw, &dir).await.is_empty() {
        assert!(Instant::now() < deadline, "never asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    theirs.delete(&unfair, None).await.unwrap();
    let asked = asking.await.unwrap().unwrap();
    assert!(asked.is_empty(), "the hold let go by itself: {asked:?}");
    assert_eq!(requests_in(&raw, &dir).await, Vec::<String>::new());
}

/// A holder that never takes a request over and holds on: the asker waits
/// for at most one operation timeout, then returns the hold as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfair_request_waits_at_most_one_operation_timeout() {
    let timeout = Duration::from_millis(800);
    let asker = ZkProvider::connect_with(ZkOptions::new(hosts()).operation_timeout(timeout))
        .await
        .unwrap();
    let raw = zookeeper_client::Client::connect(&hosts()).await.unwrap();
    let name = unique_name("asked-never-taken");
    let dir = asker.path(&name).unwrap();
    let open = zookeeper_client::Acls::anyone_all();
    raw.mkdir(&dir, &CreateMode::Container.with_acls(open))
        .await
        .unwrap();
    let unfair = format!("{dir}/_unfair_lock");
    raw.create(
        &unfair,
        b"distlock owner=old@h:1 id=x",
        &CreateMode::Ephemeral.with_acls(open),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let asked = asker
        .request_release(&name, PrimitiveKind::Mutex)
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(took < timeout * 3, "took {took:?}");
    // Still the asker's: it lives as long as the asker's session.
    let request = requests_in(&raw, &dir).await;
    assert_eq!(request.len(), 1, "{request:?}");
    let stat = raw
        .check_stat(&format!("{dir}/{}", request[0]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stat.ephemeral_owner, asker.session_id().await.unwrap());
    raw.delete(&unfair, None).await.unwrap();
}
