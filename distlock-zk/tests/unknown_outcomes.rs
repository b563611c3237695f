//! Requests whose outcome is unknown, on real ZooKeeper: a connection reset
//! (`ECONNRESET`, which zookeeper-client reports as `Error::Custom`, not as
//! a connection loss) right after the proxy forwarded a create or a delete.
//! The request ran; its reply is lost. Such an outcome is looked up or
//! retried, never taken for a refusal: no node of ours is left to block
//! the lock, a release completes, and a waiter that times out still
//! withdraws within its deadline. And bad input that used to wait: a
//! persistent node in a queue, locks on an id counter.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Error, LeaseStatus, Lock, Provider};
use distlock_zk::zookeeper_client::{self, Acls, CreateMode};
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::{unique_name, Proxy};

const SLACK: Duration = Duration::from_secs(3);

/// The victim's operation timeout: a wait may overrun its deadline by this
/// much at most.
const OPERATION: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fair,
    Unfair,
    Write,
    Read,
    /// A semaphore of one permit (its lease node).
    Semaphore,
    /// A semaphore of one permit, through its internal lock's node.
    SemaphoreLock,
}

const ALL: [Kind; 6] = [
    Kind::Fair,
    Kind::Unfair,
    Kind::Write,
    Kind::Read,
    Kind::Semaphore,
    Kind::SemaphoreLock,
];

impl Kind {
    fn lock(self, p: &ZkProvider, name: &str) -> Arc<dyn Lock> {
        match self {
            Kind::Fair => p.fair_mutex(name).unwrap(),
            Kind::Unfair => p.mutex(name).unwrap(),
            Kind::Write => p.rw_lock(name).unwrap().write(),
            Kind::Read => p.rw_lock(name).unwrap().read(),
            Kind::Semaphore | Kind::SemaphoreLock => p.semaphore(name, 1).unwrap(),
        }
    }

    /// What the holder of a conflicting hold takes (a reader waits for a
    /// writer only).
    fn blocker(self, p: &ZkProvider, name: &str) -> Arc<dyn Lock> {
        match self {
            Kind::Read => Kind::Write.lock(p, name),
            other => other.lock(p, name),
        }
    }

    /// Bytes only the create of this kind's node carries.
    fn create_marker(self) -> &'static [u8] {
        match self {
            Kind::Fair | Kind::SemaphoreLock => b"-lock-",
            Kind::Unfair => b"_unfair_lock",
            Kind::Write => b"__WRIT__",
            Kind::Read => b"__READ__",
            Kind::Semaphore => b"-lease-",
        }
    }

    /// The directory this kind's node is in.
    fn node_dir(self, dir: &str) -> String {
        match self {
            Kind::Semaphore => format!("{dir}/leases"),
            Kind::SemaphoreLock => format!("{dir}/locks"),
            _ => dir.to_owned(),
        }
    }
}

async fn provider(hosts: &str) -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts))
        .await
        .unwrap()
}

/// A provider through `proxy`, with a session long enough that a node it
/// left would outlast the test.
async fn victim(proxy: &Proxy) -> ZkProvider {
    ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(Duration::from_secs(20))
            .operation_timeout(OPERATION),
    )
    .await
    .unwrap()
}

async fn raw() -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&test_support::zookeeper::shared().connect_string())
        .await
        .unwrap()
}

/// The children of `path`, none if it does not exist.
async fn children(client: &zookeeper_client::Client, path: &str) -> Vec<String> {
    match client.list_children(path).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("listing {path}: {e}"),
    }
}

/// Every lock node under a primitive's directory (a semaphore's `locks`
/// and `leases` included).
async fn nodes_under(client: &zookeeper_client::Client, dir: &str) -> Vec<String> {
    let mut found = Vec::new();
    for child in children(client, dir).await {
        if child == "locks" || child == "leases" {
            for n in children(client, &format!("{dir}/{child}")).await {
                found.push(format!("{child}/{n}"));
            }
        } else {
            found.push(child);
        }
    }
    found
}

/// Waits until nothing is left under `dir`.
async fn nothing_under(client: &zookeeper_client::Client, dir: &str, what: &str) {
    nothing_under_within(client, dir, what, SLACK).await;
}

/// Waits until nothing is left under `dir`, for up to `within`.
async fn nothing_under_within(
    client: &zookeeper_client::Client,
    dir: &str,
    what: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let left = nodes_under(client, dir).await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: stray nodes {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The newest node of `dir` (by the sequence at the end of its name).
async fn newest(client: &zookeeper_client::Client, dir: &str) -> String {
    let mut nodes = children(client, dir).await;
    nodes.sort_by_key(|n| n[n.len().saturating_sub(10)..].to_owned());
    format!("{dir}/{}", nodes.last().expect("a node"))
}

/// A delete request of `path` on the wire: opcode 2, then the path
/// (length-prefixed).
fn delete_request(path: &str) -> Vec<u8> {
    let mut delete = vec![0, 0, 0, 2];
    delete.extend_from_slice(&i32::try_from(path.len()).unwrap().to_be_bytes());
    delete.extend_from_slice(path.as_bytes());
    delete
}

/// The create reaches the server, and the client's connection is reset at
/// once: the acquisition must look its node up (it exists) and hold with
/// it, not fail with a server error and leave the node in a live session.
/// The cause of the old flake of `connection_cuts_during_acquisition_leave_no_stray_node`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_connection_is_reset_is_looked_up_not_failed() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let other = provider(&zk.connect_string()).await;
    for kind in ALL {
        let proxy = Proxy::start(zk.addr(0));
        let locks = victim(&proxy).await;
        let name = unique_name("reset-create");
        let dir = locks.path(&name).unwrap();
        let lock = kind.lock(&locks, &name);
        // Parents first, so the create below is the lock node's.
        lock.lock().await.unwrap().release().await.unwrap();
        proxy.reset_after_request(kind.create_marker());
        let got = tokio::time::timeout(SLACK * 2, lock.lock_timeout(SLACK))
            .await
            .unwrap_or_else(|_| panic!("{kind:?}: the acquisition hung"));
        assert_eq!(proxy.resets(), 1, "{kind:?}: the create was not reset");
        let guard = got
            .unwrap_or_else(|e| panic!("{kind:?}: a reset create failed the acquisition: {e:?}"))
            .unwrap_or_else(|| panic!("{kind:?}: its own node was not found"));
        assert!(guard.is_held());
        guard.release().await.unwrap();
        let next = kind
            .lock(&other, &name)
            .try_lock()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?}: a node of the victim blocks the lock"));
        next.release().await.unwrap();
        nothing_under(&operator, &dir, &format!("{kind:?}")).await;
    }
}

/// The release's delete reaches the server, and the connection is reset at
/// once: the release completes (the node is gone), or fails with a
/// retryable error and keeps deleting in the background; never a plain
/// server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_connection_is_reset_completes() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let other = provider(&zk.connect_string()).await;
    for kind in ALL {
        if kind == Kind::SemaphoreLock {
            // A held permit's node is its lease node.
            continue;
        }
        let proxy = Proxy::start(zk.addr(0));
        let locks = victim(&proxy).await;
        let name = unique_name("reset-release");
        let dir = locks.path(&name).unwrap();
        let guard = kind.lock(&locks, &name).lock().await.unwrap();
        let node = newest(&operator, &kind.node_dir(&dir)).await;
        proxy.reset_after_request(&delete_request(&node));
        let released = tokio::time::timeout(SLACK * 2, guard.release())
            .await
            .unwrap_or_else(|_| panic!("{kind:?}: the release hung"));
        assert_eq!(proxy.resets(), 1, "{kind:?}: the delete was not reset");
        if let Err(e) = released {
            assert!(e.is_retryable(), "{kind:?}: release failed for good: {e:?}");
        }
        let next = kind
            .lock(&other, &name)
            .lock_timeout(SLACK)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?}: the released node is still there"));
        next.release().await.unwrap();
        nothing_under(&operator, &dir, &format!("{kind:?}")).await;
    }
}

/// A waiter times out, and the connection is reset as it sends the delete
/// of its node (which never reaches the server): `lock_timeout` still
/// returns within its deadline and one operation timeout, and the waiter's
/// node goes (it used to stay queued for the whole session: once the holder
/// released, it headed the queue and nobody got the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_whose_delete_is_reset_still_withdraws() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let holder = provider(&zk.connect_string()).await;
    let next = provider(&zk.connect_string()).await;
    for kind in [Kind::Fair, Kind::Write, Kind::Read, Kind::Semaphore] {
        let proxy = Proxy::start(zk.addr(0));
        let locks = victim(&proxy).await;
        let name = unique_name("reset-withdraw");
        let dir = locks.path(&name).unwrap();
        let node_dir = kind.node_dir(&dir);
        let guard = kind.blocker(&holder, &name).lock().await.unwrap();
        let lock = kind.lock(&locks, &name);
        let started = Instant::now();
        let waiting = tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(1)).await });
        // The waiter's node, behind the holder's.
        let deadline = Instant::now() + SLACK;
        while children(&operator, &node_dir).await.len() < 2 {
            assert!(
                Instant::now() < deadline,
                "{kind:?}: the waiter never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let node = newest(&operator, &node_dir).await;
        proxy.reset_instead_of_request(&delete_request(&node));
        let got = tokio::time::timeout(SLACK * 2, waiting)
            .await
            .unwrap_or_else(|_| panic!("{kind:?}: the wait hung"))
            .unwrap();
        let took = started.elapsed();
        assert!(
            matches!(got, Ok(None)),
            "{kind:?}: a timed-out wait returned {got:?}"
        );
        assert_eq!(proxy.resets(), 1, "{kind:?}: the delete was not reset");
        // The deadline, one operation timeout, and room for a loaded
        // machine: not the session (20 s).
        assert!(
            took < Duration::from_secs(1) + OPERATION + SLACK,
            "{kind:?}: a 1 s wait took {took:?}"
        );
        let deadline = Instant::now() + SLACK;
        while operator.check_stat(&node).await.unwrap().is_some() {
            assert!(
                Instant::now() < deadline,
                "{kind:?}: the timed-out waiter's node {node} is still queued"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lock = kind.lock(&next, &name);
        let taking = tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.release().await.unwrap();
        let taken = taking
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?}: an orphan node heads the queue"));
        taken.release().await.unwrap();
        nothing_under(&operator, &dir, &format!("{kind:?}")).await;
    }
}

/// A persistent node with a lock's name at the head of a queue never goes:
/// `lock()` is refused with `Error::Conflict` instead of waiting for it
/// forever, and leaves no node of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_node_at_the_head_of_a_queue_is_a_conflict() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let locks = provider(&zk.connect_string()).await;
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let sequential = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
    for kind in [Kind::Fair, Kind::Write, Kind::Read, Kind::Semaphore] {
        let name = unique_name("persistent-head");
        let dir = locks.path(&name).unwrap();
        let (sub, stuck) = match kind {
            Kind::Fair => (dir.clone(), "_c_0b6e9f0c-1d2e-4f3a-8b4c-5d6e7f8a9b0c-lock-"),
            Kind::Write | Kind::Read => (
                dir.clone(),
                "_c_0b6e9f0c-1d2e-4f3a-8b4c-5d6e7f8a9b0c-__WRIT__",
            ),
            // A persistent internal-lock node: every acquisition queues
            // behind it.
            _ => (
                format!("{dir}/locks"),
                "_c_0b6e9f0c-1d2e-4f3a-8b4c-5d6e7f8a9b0c-lock-",
            ),
        };
        operator.mkdir(&sub, &open).await.unwrap();
        let (_, seq) = operator
            .create(&format!("{sub}/{stuck}"), b"stuck", &sequential)
            .await
            .unwrap();
        let stuck = format!("{stuck}{seq}");
        let r = tokio::time::timeout(SLACK, kind.lock(&locks, &name).lock())
            .await
            .unwrap_or_else(|_| panic!("{kind:?}: lock() waits for a persistent node"));
        assert!(matches!(r, Err(Error::Conflict { .. })), "{kind:?}: {r:?}");
        assert_eq!(children(&operator, &sub).await, vec![stuck], "{kind:?}");
    }
    // An election queue with a persistent latch node at its head.
    let name = unique_name("persistent-latch");
    let dir = locks.path(&name).unwrap();
    operator.mkdir(&dir, &open).await.unwrap();
    operator
        .create(
            &format!("{dir}/_c_0b6e9f0c-1d2e-4f3a-8b4c-5d6e7f8a9b0c-latch-"),
            b"stuck",
            &sequential,
        )
        .await
        .unwrap();
    let r = tokio::time::timeout(SLACK, locks.election(&name).unwrap().campaign("c"))
        .await
        .expect("campaign waits for a persistent node");
    assert!(
        matches!(r, Err(Error::Conflict { .. })),
        "{:?}",
        r.map(|_| ())
    );
    assert_eq!(children(&operator, &dir).await.len(), 1);
}

/// A persistent node in a semaphore's `leases` never goes, so it would
/// take a permit forever: with one permit `lock()` waited for it forever
/// (`count_leases` counted every child of `leases` and never looked at
/// their owners). It is refused with `Error::Conflict` (the read of the
/// other lease nodes' data shows their `ephemeral_owner`, no extra
/// request), with free permits too, and the acquisition leaves nothing of
/// its own in `leases` or `locks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_node_in_a_semaphores_leases_is_a_conflict() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let locks = provider(&zk.connect_string()).await;
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let sequential = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
    for permits in [1, 2] {
        let name = unique_name("persistent-lease");
        let dir = locks.path(&name).unwrap();
        let leases = format!("{dir}/leases");
        operator.mkdir(&leases, &open).await.unwrap();
        let stuck = "_c_0b6e9f0c-1d2e-4f3a-8b4c-5d6e7f8a9b0c-lease-";
        let (_, seq) = operator
            .create(&format!("{leases}/{stuck}"), b"stuck", &sequential)
            .await
            .unwrap();
        let sem = locks.semaphore(&name, permits).unwrap();
        let r = tokio::time::timeout(SLACK, sem.lock())
            .await
            .unwrap_or_else(|_| {
                panic!("{permits} permits: lock() waits for a persistent lease node")
            });
        println!(
            "{permits} permits: lock() with a persistent lease node: {:?}",
            r.as_ref().map(|_| ())
        );
        assert!(
            matches!(r, Err(Error::Conflict { .. })),
            "{permits} permits: {:?}",
            r.map(|_| ())
        );
        assert_eq!(
            children(&operator, &leases).await,
            vec![format!("{stuck}{seq}")],
            "{permits} permits"
        );
        assert!(children(&operator, &format!("{dir}/locks"))
            .await
            .is_empty());
    }
}

/// Every kind of lock on a name whose node is an id counter is refused
/// with `Error::Conflict`, and leaves the counter as it was: no child under
/// it, its count unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_an_id_counter_are_a_conflict_and_add_nothing() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let locks = provider(&zk.connect_string()).await;
    let name = unique_name("counter");
    let counter = locks.path(&name).unwrap();
    let ids = locks.id_generator(&name, 1).unwrap();
    let first = ids.next().await.unwrap();
    let (data, _) = operator.get_data(&counter).await.unwrap();
    for kind in ALL {
        let lock = kind.lock(&locks, &name);
        for attempt in ["try_lock", "lock"] {
            let r = tokio::time::timeout(SLACK, async {
                if attempt == "lock" {
                    lock.lock().await.map(Some)
                } else {
                    lock.try_lock().await
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{kind:?} {attempt}: waits on an id counter"));
            assert!(
                matches!(r, Err(Error::Conflict { .. })),
                "{kind:?} {attempt}: {r:?}"
            );
            assert_eq!(
                children(&operator, &counter).await,
                Vec::<String>::new(),
                "{kind:?} {attempt}: left a node under the counter"
            );
        }
    }
    let r = tokio::time::timeout(SLACK, locks.election(&name).unwrap().campaign("c"))
        .await
        .expect("campaign waits on an id counter");
    assert!(
        matches!(r, Err(Error::Conflict { .. })),
        "{:?}",
        r.map(|_| ())
    );
    assert!(children(&operator, &counter).await.is_empty());
    assert_eq!(operator.get_data(&counter).await.unwrap().0, data);
    assert_eq!(ids.next().await.unwrap(), first + 1);
}

/// An id generator on a name that is a lock's directory, made persistent
/// by another client (kazoo's `ensure_path`, an operator), while a holder
/// holds it: the directory has no data, and the id generator used to take
/// it for a counter at 0 and write 8 bytes into it (`Ok(1)`), after which
/// every lock on that name was refused. It is refused with
/// `Error::Conflict`, writes nothing, and the lock works on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_generator_on_a_lock_directory_is_a_conflict_and_writes_nothing() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let locks = provider(&zk.connect_string()).await;
    let name = unique_name("ids-on-lock");
    let dir = locks.path(&name).unwrap();
    operator
        .mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    let held = locks.fair_mutex(&name).unwrap().lock().await.unwrap();
    let id = locks.id_generator(&name, 1).unwrap().next().await;
    let (data, stat) = operator.get_data(&dir).await.unwrap();
    println!(
        "ids on a held lock's persistent directory: {id:?}; it holds {} bytes",
        data.len()
    );
    assert!(matches!(id, Err(Error::Conflict { .. })), "{id:?}");
    assert!(data.is_empty(), "the id generator wrote {data:?}");
    assert_eq!(stat.version, 0, "the directory's data was written");
    held.release().await.unwrap();
    locks
        .fair_mutex(&name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("the lock is free")
        .release()
        .await
        .unwrap();
}

/// `lock_timeout(1 s)` on every lock primitive, partitioned (blackhole and
/// cut) 200 ms into its wait: it returns within its deadline and one
/// operation timeout (700 ms here), without the lock and with at most a
/// retryable error; once the partition heals, its node goes and the lock
/// passes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_keeps_its_deadline_through_a_partition() {
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let holder = provider(&zk.connect_string()).await;
    let next = provider(&zk.connect_string()).await;
    for kind in [
        Kind::Fair,
        Kind::Unfair,
        Kind::Write,
        Kind::Read,
        Kind::Semaphore,
    ] {
        let proxy = Proxy::start(zk.addr(0));
        let locks = ZkProvider::connect_with(
            ZkOptions::new(proxy.addr().to_string())
                .session_timeout(Duration::from_secs(20))
                .operation_timeout(Duration::from_millis(700)),
        )
        .await
        .unwrap();
        let name = unique_name("partitioned-wait");
        let dir = locks.path(&name).unwrap();
        let guard = kind.blocker(&holder, &name).lock().await.unwrap();
        let what = format!("{kind:?}");
        test_support::proxy::wait_keeps_its_deadline_through_a_partition(
            &proxy,
            kind.lock(&locks, &name),
            &what,
        )
        .await;
        let lock = kind.lock(&next, &name);
        let taking = tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.release().await.unwrap();
        let taken =
            taking.await.unwrap().unwrap().unwrap_or_else(|| {
                panic!("{kind:?}: the partitioned waiter's node blocks the lock")
            });
        taken.release().await.unwrap();
        // The victim's node goes once its client is back: a connection
        // attempt made during the partition may take the connect timeout
        // (5 s) to give up before the next one gets through.
        nothing_under_within(&operator, &dir, &what, Duration::from_secs(5) + SLACK * 2).await;
    }
}

/// A provider through a new proxy to the shared server, with these
/// session and operation timeouts.
async fn proxied(session: Duration, operation: Duration) -> (Proxy, ZkProvider) {
    let proxy = Proxy::start(test_support::zookeeper::shared().addr(0));
    let provider = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(session)
            .operation_timeout(operation),
    )
    .await
    .unwrap();
    (proxy, provider)
}

/// `LockSet::lock_timeout(1 s)` of ten names on a server whose every
/// request takes about 400 ms: within 1 s plus one operation timeout
/// (before: a member per request past the deadline, several seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_keeps_its_deadline_on_a_slow_server() {
    let operation_timeout = Duration::from_secs(1);
    let (proxy, slow) = proxied(Duration::from_secs(20), operation_timeout).await;
    let direct = provider(&test_support::zookeeper::shared().connect_string()).await;
    test_support::multi::set_keeps_its_deadline_on_a_slow_server(
        &proxy,
        |name| slow.mutex(name).unwrap(),
        |name| direct.mutex(name).unwrap(),
        operation_timeout,
        "zookeeper mutex",
    )
    .await;
}

/// `LockSet::lock_timeout(1 s)` partitioned while it holds two names and
/// waits for a third: it returns within 1 s plus one operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_keeps_its_deadline_through_a_partition() {
    let operation_timeout = Duration::from_millis(700);
    let (proxy, cut) = proxied(Duration::from_secs(4), operation_timeout).await;
    let direct = provider(&test_support::zookeeper::shared().connect_string()).await;
    test_support::multi::set_keeps_its_deadline_through_a_partition(
        &proxy,
        |name| cut.mutex(name).unwrap(),
        |name| direct.mutex(name).unwrap(),
        operation_timeout,
        "zookeeper mutex",
    )
    .await;
}

/// A release of the unfair mutex cancelled half-way, its delete still on
/// the (slow) wire: the release finished in the background must not send
/// a second delete at version 0, which would land after the first and
/// delete the node the next holder created meanwhile (before: the next
/// holder's lock was deleted under it, `lost()` fired, and a third client
/// could take the lock beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_half_way_never_deletes_the_next_holders_node() {
    let zk = test_support::zookeeper::shared();
    let (proxy, slow) = proxied(Duration::from_secs(20), Duration::from_secs(2)).await;
    let next = provider(&zk.connect_string()).await;
    let name = unique_name("cancelled-release");
    let guard = slow.mutex(&name).unwrap().lock().await.unwrap();
    let lock = next.mutex(&name).unwrap();
    let waiting = tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Each way 150 ms: the delete lands 150 ms after it is sent, and the
    // next holder's create comes right after that.
    proxy.set_delay(Duration::from_millis(150));
    let cancelled = tokio::time::timeout(Duration::from_millis(50), guard.release()).await;
    assert!(
        cancelled.is_err(),
        "the release finished within 50 ms through a 300 ms round trip"
    );
    let taken = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the lock passes on once the release lands");
    // Long enough for anything the cancelled release sent to land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set_delay(Duration::ZERO);
    assert_eq!(
        taken.status(),
        LeaseStatus::Held,
        "the next holder's node was deleted by a release of the one before"
    );
    taken.release().await.unwrap();
}

/// The sum of `zk_packets_received` over the ensemble (`mntr`).
fn packets_received(zk: &test_support::ZkCluster) -> u64 {
    use std::io::{Read, Write};
    (0..zk.len())
        .map(|i| {
            let Ok(mut s) = std::net::TcpStream::connect(zk.addr(i)) else {
                return 0;
            };
            let _ = s.write_all(b"mntr");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out.lines()
                .find_map(|l| l.strip_prefix("zk_packets_received"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// An ensemble whose sessions are local and never upgraded refuses every
/// ephemeral create with `EPHEMERALONLOCALSESSION` (-120), a code
/// zookeeper-client has no variant for (`UnexpectedErrorCode(-120)`). It
/// is the server's answer, not an unknown outcome: `try_lock` and
/// `lock_timeout` on the fair and the unfair mutex fail at once with a
/// non-retryable error and a handful of requests (they used to create,
/// look up and create again in a hot loop: 15-18 thousand requests in 10 s,
/// and `try_lock` never returned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_creates_refused_by_a_local_session_fail_at_once() {
    let zk = test_support::zookeeper::ZkCluster::start_with(
        3,
        "localSessionsEnabled=true\nlocalSessionsUpgradingEnabled=false\n",
    );
    let locks = provider(&zk.connect_string()).await;
    let name = unique_name("local-session");
    for fair in [true, false] {
        let lock: Arc<dyn Lock> = if fair {
            locks.fair_mutex(&name).unwrap()
        } else {
            locks.mutex(&name).unwrap()
        };
        let before = packets_received(&zk);
        let tried = tokio::time::timeout(Duration::from_secs(10), lock.try_lock())
            .await
            .unwrap_or_else(|_| panic!("fair {fair}: try_lock did not return in 10 s"));
        let requests = packets_received(&zk) - before;
        println!("fair {fair}: try_lock: {tried:?}, {requests} requests received by the ensemble");
        assert!(
            matches!(&tried, Err(Error::Server { .. })),
            "fair {fair}: try_lock: {tried:?}"
        );
        // The directories, the create and what rides with it, a lookup at
        // most: a loop sends thousands.
        assert!(requests < 50, "fair {fair}: {requests} requests");
        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            lock.lock_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap_or_else(|_| panic!("fair {fair}: lock_timeout(1 s) did not return in 10 s"));
        println!("fair {fair}: lock_timeout(1 s): {waited:?}");
        assert!(
            matches!(&waited, Err(e) if !e.is_retryable()),
            "fair {fair}: lock_timeout(1 s) on a free lock: {waited:?}"
        );
    }
}

/// A provider through `proxy` with a long operation timeout, so that the
/// deadline plus one operation timeout and plus two are far apart.
async fn slow_victim(proxy: &Proxy, operation: Duration) -> ZkProvider {
    ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(Duration::from_secs(20))
            .operation_timeout(operation),
    )
    .await
    .unwrap()
}

/// What a deadline check allows beyond the documented bound (`d` and one
/// operation timeout): scheduling on a loaded machine.
const SCHEDULING: Duration = Duration::from_millis(1500);

/// A semaphore waiter gets the internal lock shortly before its deadline
/// (the waiter ahead of it gives up), and the reply to its lease create is
/// lost (the request lands). The create keeps its whole operation timeout,
/// and the withdraw after it only what is left of the deadline plus one
/// operation timeout (the crate docs' bound); the rest of the cleanup
/// finishes in the background, and nothing is left once the connection is
/// back. (Before, the withdraw took one more operation timeout: a 5 s wait
/// with a 3 s operation timeout returned after 10.9 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_lease_create_near_the_deadline_keeps_the_deadline() {
    let operation = Duration::from_secs(3);
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let holder = provider(&zk.connect_string()).await;
    let ahead = provider(&zk.connect_string()).await;
    let proxy = Proxy::start(zk.addr(0));
    let locks = slow_victim(&proxy, operation).await;
    let name = unique_name("semaphore-deadline");
    let dir = locks.path(&name).unwrap();
    let held = holder.semaphore(&name, 1).unwrap().lock().await.unwrap();
    let wait = Duration::from_secs(5);
    let first = ahead.semaphore(&name, 1).unwrap();
    let started_ahead = Instant::now();
    let ahead_waits =
        tokio::spawn(async move { first.lock_timeout(Duration::from_millis(4900)).await });
    let locks_dir = format!("{dir}/locks");
    while children(&operator, &locks_dir).await.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The victim queues behind it; the one ahead gives up ~4.7 s into the
    // victim's 5 s wait, and the victim then creates its lease node.
    tokio::time::sleep(Duration::from_millis(200).saturating_sub(started_ahead.elapsed())).await;
    proxy.lose_reply_to(b"-lease-");
    let sem = locks.semaphore(&name, 1).unwrap();
    let started = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(30), sem.lock_timeout(wait))
        .await
        .expect("hung");
    let took = started.elapsed();
    println!(
        "semaphore lock_timeout({wait:?}), operation timeout {operation:?}: {:?} after {took:?}",
        got.as_ref().map(Option::is_some),
    );
    assert!(proxy.losing_replies(), "the lease create was not sent");
    assert!(matches!(ahead_waits.await.unwrap(), Ok(None)));
    proxy.heal();
    proxy.cut();
    assert!(!matches!(got, Ok(Some(_))), "{got:?}");
    assert!(
        took < wait + operation + SCHEDULING,
        "lock_timeout({wait:?}) took {took:?}: more than the deadline and one operation timeout ({operation:?})"
    );
    held.release().await.unwrap();
    nothing_under(&operator, &format!("{dir}/leases"), "semaphore leases").await;
    nothing_under(&operator, &locks_dir, "semaphore locks").await;
}

/// A fair waiter whose very first create's reply is lost: the create keeps
/// its whole operation timeout (3 s, more than the 1 s wait), and the
/// withdraw after it gets what is left of the deadline plus one operation
/// timeout: `lock_timeout(d)` returns within `d` and one operation timeout.
/// (Before, the withdraw took a whole operation timeout more: 6.0 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_whose_first_create_is_unanswered_keeps_the_deadline() {
    let operation = Duration::from_secs(3);
    let zk = test_support::zookeeper::shared();
    let operator = raw().await;
    let holder = provider(&zk.connect_string()).await;
    let proxy = Proxy::start(zk.addr(0));
    let locks = slow_victim(&proxy, operation).await;
    let name = unique_name("fair-deadline");
    let dir = locks.path(&name).unwrap();
    let held = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
    let wait = Duration::from_secs(1);
    proxy.lose_reply_to(b"-lock-");
    let started = Instant::now();
    let got = locks.fair_mutex(&name).unwrap().lock_timeout(wait).await;
    let took = started.elapsed();
    println!(
        "fair lock_timeout({wait:?}), operation timeout {operation:?}: {got:?} after {took:?}"
    );
    assert!(proxy.losing_replies(), "the create was not sent");
    proxy.heal();
    proxy.cut();
    held.release().await.unwrap();
    nothing_under(&operator, &dir, "fair deadline").await;
    assert!(!matches!(got, Ok(Some(_))), "{got:?}");
    assert!(
        took < wait + operation + SCHEDULING,
        "lock_timeout({wait:?}) took {took:?}: more than the deadline and one operation timeout ({operation:?})"
    );
}
