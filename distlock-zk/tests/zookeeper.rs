//! ZooKeeper-specific behaviour against real servers: FIFO and one watch
//! per handoff, the unfair herd, leader failover, session expiry through a
//! blackholed proxy, node deletion, election, ids, ACLs, bad input.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use distlock_core::{Error, LostReason, Provider};
use distlock_zk::zookeeper_client::{self, Acls, CreateMode};
use distlock_zk::{ZkOptions, ZkProvider};
use futures::StreamExt;
use test_support::conformance::eventually_locks;
use test_support::{free_port, unique_name, Proxy, ZkCluster};

const SLACK: Duration = Duration::from_secs(5);

fn hosts() -> String {
    test_support::zookeeper::shared().connect_string()
}

async fn provider(hosts: &str) -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts))
        .await
        .unwrap()
}

async fn raw(hosts: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(hosts).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mutex_is_fifo_with_one_watch_notification_per_handoff() {
    const WAITERS: usize = 8;
    let hosts = hosts();
    let name = unique_name("fifo");
    let holder = provider(&hosts).await;
    let first = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut providers = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let p = provider(&hosts).await;
        let lock = p.fair_mutex(&name).unwrap();
        providers.push(p);
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // Let waiter i queue before waiter i + 1.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(SLACK, t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    let notifications: u64 = providers.iter().map(ZkProvider::watch_events).sum();
    assert_eq!(
        notifications, WAITERS as u64,
        "one watch notification per handoff, no herd"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfair_mutex_wakes_every_waiter_on_release() {
    const WAITERS: usize = 6;
    let hosts = hosts();
    let name = unique_name("herd");
    let holder = provider(&hosts).await;
    let guard = holder.mutex(&name).unwrap().lock().await.unwrap();
    let waiters = provider(&hosts).await;
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let lock = waiters.mutex(&name).unwrap();
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            g.release().await.unwrap();
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(SLACK, t).await.unwrap().unwrap();
    }
    // The herd: the first release alone wakes all six.
    assert!(
        waiters.watch_events() >= WAITERS as u64,
        "{} notifications",
        waiters.watch_events()
    );
}

/// The session timeout of the failover test's holder. Its lease is
/// documented to survive any outage of its connection shorter than
/// `SESSION / 2` less one retry (`LeaseTerms::Session`: lost at `3/4` of
/// the timeout after the last confirmed check, checks every `1/4`, a
/// failed one retried after `1/16`), so 30 s tolerates a failover of
/// some 13 s: the ensemble's election, slowed by a loaded machine, stays
/// well inside it.
const SESSION: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_survives_the_ensemble_leader_being_killed() {
    let mut zk = ZkCluster::start(3);
    let hosts = zk.connect_string();
    let name = unique_name("failover");
    let holder = ZkProvider::connect_with(ZkOptions::new(&hosts).session_timeout(SESSION))
        .await
        .unwrap();
    let other = provider(&hosts).await;
    let guard = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
    let token = guard.fencing_token();
    let leader = zk.leader().unwrap();
    let killed = Instant::now();
    zk.kill(leader);
    // Wait for the ensemble to serve again, then check the lock is intact.
    let deadline = killed + Duration::from_secs(30);
    loop {
        match other.fair_mutex(&name).unwrap().try_lock().await {
            Ok(None) => break,
            Ok(Some(g)) => panic!("took a held lock after failover: {g:?}"),
            Err(e) => assert!(Instant::now() < deadline, "ensemble not back: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outage = killed.elapsed();
    eprintln!("failover outage {outage:?}");
    let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost()).await;
    // The margin the docs promise, less the 2 s watched above and the
    // time the holder's own reconnection may take beyond the other's.
    let promised = SESSION / 2 - SESSION / 16 - Duration::from_secs(4);
    if outage < promised {
        assert!(
            lost.is_err(),
            "lost() fired across a failover of {outage:?}: {lost:?}"
        );
        assert!(guard.is_held());
        guard.release().await.unwrap();
    } else {
        // A failover longer than the margin may cost the lease, and then
        // only as documented: expired locally, never taken.
        assert!(
            matches!(lost, Err(_) | Ok(LostReason::Expired)),
            "after a failover of {outage:?}: {lost:?}"
        );
        let _ = guard.release().await;
    }
    let next = other.fair_mutex(&name).unwrap().lock().await.unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_fires_lost_lets_others_in_and_the_provider_reconnects() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("expiry");
    let options =
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_millis(1000));
    let victim = ZkProvider::connect_with(options).await.unwrap();
    let timeout = victim.session_timeout().await.unwrap();
    let first_session = victim.session_id().await.unwrap();
    let other = provider(&zk.connect_string()).await;
    let lock = victim.fair_mutex(&name).unwrap();
    let guard = lock.lock().await.unwrap();
    let watch = guard.watch();

    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });

    proxy.set_blackhole(true);
    let cut_at = Instant::now();
    // The server expires the session: another client gets the lock.
    let taken = other
        .fair_mutex(&name)
        .unwrap()
        .lock_timeout(timeout * 3 + SLACK)
        .await
        .unwrap()
        .expect("the expired holder's lock was not freed");
    let taken_at = Instant::now();
    assert!(taken.fencing_token() > guard.fencing_token());
    // The holder knew before anybody else could hold: lost() fires at the
    // session timeout less the drift margin since the server was last heard,
    // not when the client library gives up on the session (7/5 of it).
    assert!(!watch.status().is_active());
    let (reason, lost_at) = lost_at.await.unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at <= taken_at,
        "lost() fired {:?} after another client acquired",
        lost_at - taken_at
    );
    assert!(
        lost_at - cut_at <= timeout,
        "lost() later than the session timeout"
    );
    proxy.set_blackhole(false);
    assert!(guard.release().await.unwrap_err().is_not_held());
    taken.release().await.unwrap();
    // The same provider opens a new session and locks again.
    let again = eventually_locks(lock.as_ref(), SLACK * 2, "the provider").await;
    assert_ne!(victim.session_id().await.unwrap(), first_session);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_holders_node_fires_lost() {
    let hosts = hosts();
    let locks = provider(&hosts).await;
    for fair in [true, false] {
        let name = unique_name("deleted");
        let lock = if fair {
            locks.fair_mutex(&name)
        } else {
            locks.mutex(&name)
        }
        .unwrap();
        let guard = lock.lock().await.unwrap();
        let dir = locks.path(&name).unwrap();
        let operator = raw(&hosts).await;
        let children = operator.list_children(&dir).await.unwrap();
        assert_eq!(children.len(), 1, "{children:?}");
        operator
            .delete(&format!("{dir}/{}", children[0]), None)
            .await
            .unwrap();
        let reason = tokio::time::timeout(SLACK, guard.lost()).await.unwrap();
        assert_eq!(reason, LostReason::Deleted);
        assert!(guard.release().await.unwrap_err().is_not_held());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_has_exactly_one_leader_as_leaders_are_killed_in_turn() {
    const CANDIDATES: usize = 5;
    let hosts = hosts();
    let name = unique_name("election");
    let observer = provider(&hosts).await;
    let mut observed = observer.election(&name).unwrap().observe();
    assert_eq!(observed.next().await.unwrap().unwrap(), None);
    let leading = Arc::new(AtomicUsize::new(0));
    let mut quit = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..CANDIDATES {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        quit.push(Some(tx));
        let hosts = hosts.clone();
        let name = name.clone();
        let leading = Arc::clone(&leading);
        tasks.push(tokio::spawn(async move {
            let p = provider(&hosts).await;
            let leadership = p
                .election(&name)
                .unwrap()
                .campaign(&format!("node-{i}"))
                .await
                .unwrap();
            leading.fetch_add(1, Ordering::SeqCst);
            let _ = rx.await;
            leading.fetch_sub(1, Ordering::SeqCst);
            // "Kill": the candidate's session ends with its provider.
            drop(leadership);
            drop(p);
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen = Vec::new();
    let mut terms = Vec::new();
    while seen.len() < CANDIDATES {
        let leader = tokio::time::timeout(SLACK, observed.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Some(info) = leader else { continue };
        // The observed leader knows it leads, and nobody else thinks so.
        let deadline = Instant::now() + SLACK;
        while leading.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "{} never learned it leads",
                info.id
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(leading.load(Ordering::SeqCst), 1, "two leaders at once");
        let index: usize = info.id.trim_start_matches("node-").parse().unwrap();
        assert!(!seen.contains(&index), "{} led twice", info.id);
        seen.push(index);
        terms.push(info.term);
        quit[index].take().unwrap().send(()).unwrap();
    }
    assert_eq!(
        seen,
        (0..CANDIDATES).collect::<Vec<_>>(),
        "leaders in campaign order"
    );
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms {terms:?}");
    for t in tasks {
        t.await.unwrap();
    }
    let last = tokio::time::timeout(SLACK, observed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(last, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_unique_and_increasing_per_task() {
    let hosts = hosts();
    let first = provider(&hosts).await;
    let clients: [Arc<dyn Provider>; 2] =
        [Arc::new(first.clone()), Arc::new(provider(&hosts).await)];
    for (block, name) in test_support::conformance::ids_unique_and_increasing(clients).await {
        // Curator's format: 8 bytes, big-endian; 8000 ids in whole blocks.
        let (data, _) = raw(&hosts)
            .await
            .get_data(&first.path(&name).unwrap())
            .await
            .unwrap();
        assert_eq!(data.len(), 8);
        assert_eq!(
            u64::from_be_bytes(data.try_into().unwrap()),
            8000_u64.div_ceil(block) * block
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_only_acls_keep_other_identities_off_the_holders_node() {
    let zk = test_support::zookeeper::shared();
    let url = format!("zk://alice:secret@{}/acl-test", zk.connect_string());
    let alice = ZkProvider::connect(&url).await.unwrap();
    let name = unique_name("acl");
    let guard = alice.fair_mutex(&name).unwrap().lock().await.unwrap();
    let dir = alice.path(&name).unwrap();
    assert!(dir.starts_with("/acl-test/distlock/"));
    let stranger = raw(&zk.connect_string()).await;
    // Reading the children needs READ, denied too; the delete is refused.
    let node = {
        let alice_raw = zookeeper_client::Client::connector()
            .with_auth("digest", b"alice:secret")
            .connect(&zk.connect_string())
            .await
            .unwrap();
        let children = alice_raw.list_children(&dir).await.unwrap();
        format!("{dir}/{}", children[0])
    };
    let r = stranger.delete(&node, None).await;
    assert!(matches!(r, Err(zookeeper_client::Error::NoAuth)), "{r:?}");
    assert!(guard.is_held());
    // A stranger's distlock cannot take or break it either: a typed error.
    let stranger_locks = ZkProvider::connect(&format!("zk://{}/acl-test", zk.connect_string()))
        .await
        .unwrap();
    let r = stranger_locks.fair_mutex(&name).unwrap().try_lock().await;
    assert!(matches!(&r, Err(e) if e.is_not_allowed()), "{r:?}");
    let r = stranger_locks
        .force_release(&name, distlock_core::PrimitiveKind::FairMutex)
        .await;
    assert!(matches!(&r, Err(e) if e.is_not_allowed()), "{r:?}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn an_unreachable_ensemble_fails_within_the_connect_timeout() {
    let hosts = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let start = Instant::now();
    let r = ZkProvider::connect_with(ZkOptions::new(hosts).connect_timeout(Duration::from_secs(1)))
        .await;
    assert!(r.unwrap_err().is_retryable());
    assert!(start.elapsed() < Duration::from_secs(1) + SLACK);
    for bad in [
        "zk://",
        "zk://nohost",
        "zk://127.0.0.1:1/bad path",
        "zk://127.0.0.1:1?x=1",
    ] {
        let e = ZkProvider::connect(bad).await.unwrap_err();
        assert!(e.is_invalid_input(), "{bad}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_holding_something_else_is_a_conflict_and_left_untouched() {
    let hosts = hosts();
    let locks = provider(&hosts).await;
    let operator = raw(&hosts).await;
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());

    // An ephemeral node where the lock directory would be.
    let name = unique_name("ephemeral-dir");
    let dir = locks.path(&name).unwrap();
    let parent = dir.rsplit_once('/').unwrap().0.to_owned();
    operator.mkdir(&parent, &open).await.unwrap();
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    operator
        .create(&dir, b"not a lock", &ephemeral)
        .await
        .unwrap();
    for fair in [true, false] {
        let lock = if fair {
            locks.fair_mutex(&name)
        } else {
            locks.mutex(&name)
        }
        .unwrap();
        let r = lock.try_lock().await;
        assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    }
    assert_eq!(operator.get_data(&dir).await.unwrap().0, b"not a lock");

    // A persistent node where the unfair lock node would be.
    let name = unique_name("persistent-lock");
    let dir = locks.path(&name).unwrap();
    operator.mkdir(&dir, &open).await.unwrap();
    operator
        .create(&format!("{dir}/_unfair_lock"), b"stuck", &open)
        .await
        .unwrap();
    let r = locks
        .mutex(&name)
        .unwrap()
        .lock_timeout(Duration::from_millis(200))
        .await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(
        operator
            .get_data(&format!("{dir}/_unfair_lock"))
            .await
            .unwrap()
            .0,
        b"stuck"
    );

    // An id counter whose data is not 8 bytes.
    let name = unique_name("not-a-counter");
    let dir = locks.path(&name).unwrap();
    operator.mkdir(&dir, &open).await.unwrap();
    operator.set_data(&dir, b"hello", None).await.unwrap();
    let r = locks.id_generator(&name, 1).unwrap().next().await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(operator.get_data(&dir).await.unwrap().0, b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cuts_during_acquisition_leave_no_stray_node() {
    static SEED: OnceLock<u64> = OnceLock::new();
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("cuts");
    let locks = ZkProvider::connect_with(ZkOptions::new(proxy.addr().to_string()))
        .await
        .unwrap();
    let lock = locks.fair_mutex(&name).unwrap();
    let mut x = *SEED.get_or_init(|| 0x9E37_79B9_7F4A_7C15);
    for _ in 0..30 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let cut_after = Duration::from_micros(x % 3000);
        let attempt = tokio::spawn({
            let lock = Arc::clone(&lock);
            async move { lock.lock_timeout(Duration::from_secs(3)).await }
        });
        tokio::time::sleep(cut_after).await;
        proxy.cut();
        if let Ok(Ok(Some(g))) = attempt.await {
            let _ = g.release().await;
        }
    }
    // Nothing of ours may remain: every node was either released or deleted.
    let operator = raw(&zk.connect_string()).await;
    let dir = locks.path(&name).unwrap();
    let deadline = Instant::now() + SLACK;
    loop {
        let left = operator.list_children(&dir).await.unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "stray nodes: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let g = lock.try_lock().await.unwrap().expect("free after the cuts");
    g.release().await.unwrap();
}

fn kazoo(hosts: &str, path: &str, args: &[&str]) -> std::process::Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo_lock.py");
    std::process::Command::new("python3")
        .arg(script)
        .args([hosts, path])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/install-servers.sh installs kazoo)")
}

fn output(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kazoo helper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One way only: distlock orders kazoo's `…__lock__<seq>` nodes into its
/// queue, but kazoo's `Lock` counts only `__lock__` contenders and so does
/// not see distlock's Curator-named nodes (documented in the crate docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_fair_mutex_queues_behind_a_kazoo_lock() {
    let hosts = hosts();
    let locks = provider(&hosts).await;
    let name = unique_name("kazoo");
    let path = locks.path(&name).unwrap();
    let lock = locks.fair_mutex(&name).unwrap();

    // kazoo holds: distlock queues behind its node and gets in on release.
    let holder = kazoo(&hosts, &path, &["hold", "1"]);
    let operator = raw(&hosts).await;
    let deadline = Instant::now() + test_support::PEER_START;
    while operator
        .list_children(&path)
        .await
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "kazoo never took the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "jumped kazoo's queue"
    );
    let g = lock
        .lock_timeout(SLACK)
        .await
        .unwrap()
        .expect("kazoo's release not seen");
    let out = tokio::task::spawn_blocking(move || output(holder))
        .await
        .unwrap();
    assert_eq!(out, "acquired\nreleased");
    g.release().await.unwrap();
}

#[test]
fn arbitrary_names_ttls_and_timeouts_give_typed_errors_and_store_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let hosts = hosts();
    let locks = rt.block_on(provider(&hosts));
    let operator = rt.block_on(raw(&hosts));
    let client: Arc<dyn Provider> = Arc::new(locks);
    let prefix = unique_name("props") + "/";
    // Handing out primitives does no I/O: while names are tried, nothing
    // may appear under this test's prefix.
    let top = format!(
        "{}/{}",
        ZkOptions::DEFAULT_BASE,
        prefix.split('/').next().unwrap()
    );
    test_support::properties::check(rt.handle(), &client, &prefix, |_| {
        matches!(rt.block_on(operator.check_stat(&top)), Ok(Some(_)))
    });
}

/// `block_on(lock.lock())`: the future is made before the runtime is
/// entered, and runs inside it.
#[test]
fn a_lock_future_made_outside_the_runtime_runs_inside_it() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(provider(
        &test_support::zookeeper::shared().connect_string(),
    ));
    let name = unique_name("outside");
    for lock in [
        client.fair_mutex(&name).unwrap(),
        client.mutex(&name).unwrap(),
    ] {
        let locking = lock.lock();
        let guard = rt.block_on(locking).unwrap();
        rt.block_on(guard.release()).unwrap();
    }
    rt.block_on(client.close()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquisition_is_small() {
    // What a waiting task keeps: the acquire future (every step but the
    // wait is boxed). It was 5.3 KB (fair) and 5.1 KB (unfair), then 936
    // and 632 B, then 656 and 512 B in release builds; each attempt is now
    // one boxed step that ends before the wait, the queue's future is the
    // acquire's own and keeps its arguments once, the wait is a small
    // future of its own, and the fair acquire maps the queue's future to
    // a guard with no async body around it (368 and 384 B).
    let client = provider(&test_support::zookeeper::shared().connect_string()).await;
    let name = unique_name("size");
    for (lock, bound) in [
        (client.fair_mutex(&name).unwrap(), 416),
        (client.mutex(&name).unwrap(), 416),
    ] {
        let waiting = lock.acquire(distlock_core::Wait::Forever);
        let size = std::mem::size_of_val(&*waiting);
        println!("ZooKeeper acquire future: {size} bytes");
        assert!(size <= bound, "{size} bytes");
        // `lock()` is that future, boxed once, and nothing around it.
        let locking = lock.lock();
        assert_eq!(std::mem::size_of_val(&locking), 16, "lock() adds state");
    }
}
