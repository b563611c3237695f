//! The ZooKeeper counting semaphore on a real server: the bound under
//! contention across clients, fencing tokens, permits that come back when a
//! session ends, cancellation and tries that leave nothing, the permits
//! mismatch, one wake-up per release, a lost create reply; and interop both
//! ways with Apache Curator 5.4's `InterProcessSemaphoreV2`.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::io::BufRead;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{Error, LostReason, Provider, Semaphore};
use distlock_zk::zookeeper_client;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::{unique_name, Proxy};

const SLACK: Duration = Duration::from_secs(3);
/// Room for a JVM to start and connect.
const JVM: Duration = Duration::from_secs(20);

fn hosts() -> String {
    test_support::zookeeper::shared().connect_string()
}

async fn provider(hosts: &str) -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts))
        .await
        .unwrap()
}

fn semaphore(p: &ZkProvider, name: &str, permits: u32) -> Arc<dyn Semaphore> {
    p.semaphore(name, permits).unwrap()
}

/// The children of `ROOT/NAME/locks` and `ROOT/NAME/leases`, read by a
/// client of its own.
struct Nodes {
    client: zookeeper_client::Client,
    dir: String,
}

impl Nodes {
    async fn new(p: &ZkProvider, name: &str) -> Self {
        Nodes {
            client: zookeeper_client::Client::connect(&hosts()).await.unwrap(),
            dir: p.path(name).unwrap(),
        }
    }

    async fn children(&self, sub: &str) -> Vec<String> {
        let path = format!("{}/{sub}", self.dir);
        match self.client.list_children(&path).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("listing {path}: {e}"),
        }
    }

    /// `(locks, leases)` child counts.
    async fn counts(&self) -> (usize, usize) {
        (
            self.children("locks").await.len(),
            self.children("leases").await.len(),
        )
    }

    /// Waits until the counts are `want`.
    async fn settle(&self, want: (usize, usize), within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.counts().await;
            if now == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "(locks, leases) = {now:?}, want {want:?}: locks {:?}, leases {:?}",
                self.children("locks").await,
                self.children("leases").await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_holders_across_clients() {
    const PERMITS: u32 = 2;
    const CLIENTS: usize = 3;
    const TASKS: usize = 3;
    const ROUNDS: usize = 4;
    let hosts = hosts();
    let name = unique_name("bound");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut providers = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let p = provider(&hosts).await;
        for _ in 0..TASKS {
            let sem = semaphore(&p, &name, PERMITS);
            let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = sem.lock().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
        providers.push(p);
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        PERMITS as usize,
        "never more than {PERMITS} holders, and the permits were used"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), CLIENTS * TASKS * ROUNDS);
    let unique: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(unique.len(), tokens.len(), "a fencing token came twice");
    Nodes::new(&providers[0], &name)
        .await
        .settle((0, 0), SLACK)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_unique_and_increasing_across_clients() {
    let hosts = hosts();
    let name = unique_name("tokens");
    let a = provider(&hosts).await;
    let b = provider(&hosts).await;
    let (sa, sb) = (semaphore(&a, &name, 2), semaphore(&b, &name, 2));
    let mut last = 0;
    for round in 0..4 {
        // Two permits out at once: two tokens, each above every earlier one.
        let first = if round % 2 == 0 { &sa } else { &sb };
        let second = if round % 2 == 0 { &sb } else { &sa };
        let g1 = first.lock().await.unwrap();
        let g2 = second.lock().await.unwrap();
        assert!(g1.fencing_token() > last, "token went back");
        assert!(g2.fencing_token() > g1.fencing_token(), "token went back");
        last = g2.fencing_token();
        g1.release().await.unwrap();
        g2.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_ends_frees_its_permit_for_a_waiter() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("expiry");
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    let timeout = victim.session_timeout().await.unwrap();
    let other = provider(&zk.connect_string()).await;
    let guard = semaphore(&victim, &name, 1).lock().await.unwrap();
    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });
    let waiting = semaphore(&other, &name, 1);
    let waiter = tokio::spawn(async move {
        let g = waiting.lock_timeout(Duration::from_secs(30)).await;
        (g, Instant::now())
    });
    let nodes = Nodes::new(&other, &name).await;
    // The waiter holds the internal lock and has its lease node too.
    nodes.settle((1, 2), SLACK).await;
    proxy.set_blackhole(true);
    let (taken, taken_at) = tokio::time::timeout(timeout * 3 + SLACK, waiter)
        .await
        .expect("the ended session's permit never came back")
        .unwrap();
    let taken = taken.unwrap().expect("the waiter gave up");
    assert!(taken.fencing_token() > guard.fencing_token());
    let (reason, lost_at) = lost_at.await.unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at <= taken_at,
        "lost() fired after the next holder got in"
    );
    proxy.heal();
    assert!(guard.release().await.unwrap_err().is_not_held());
    taken.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_expires_queues_again_on_a_new_one() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("wait-expiry");
    let holder = provider(&zk.connect_string()).await;
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    let timeout = victim.session_timeout().await.unwrap();
    let first_session = victim.session_id().await.unwrap();
    let guard = semaphore(&holder, &name, 1).lock().await.unwrap();
    let nodes = Nodes::new(&holder, &name).await;
    let waiter = tokio::spawn({
        let sem = semaphore(&victim, &name, 1);
        async move { sem.lock_timeout(Duration::from_secs(60)).await }
    });
    nodes.settle((1, 2), SLACK).await;
    // The server expires the waiter's session and its nodes with it.
    proxy.set_blackhole(true);
    let cut_at = Instant::now();
    nodes.settle((0, 1), timeout * 3 + SLACK).await;
    // Still partitioned when the client gives the session up itself (at
    // 7/5 of the timeout after it last heard the server) and tries to
    // open a new one: the waiter must keep trying, not fail. (Healed at
    // once, the client may instead learn of the expiry from the server on
    // reconnecting: the test then passed or failed by which came first.)
    tokio::time::sleep((cut_at + timeout * 3).saturating_duration_since(Instant::now())).await;
    assert!(
        !waiter.is_finished(),
        "the waiter gave up: {:?}",
        waiter.await
    );
    proxy.heal();
    // Back on a new session, queued again.
    nodes.settle((1, 2), timeout * 3 + SLACK).await;
    assert!(!waiter.is_finished(), "the waiter gave up");
    guard.release().await.unwrap();
    let got = tokio::time::timeout(SLACK, waiter)
        .await
        .expect("the re-queued waiter did not get the permit")
        .unwrap()
        .unwrap()
        .expect("a permit");
    assert!(got.is_held());
    assert_ne!(victim.session_id().await.unwrap(), first_session);
    nodes.settle((0, 1), SLACK).await;
    got.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_or_timed_out_waiters_leave_no_node() {
    let hosts = hosts();
    let name = unique_name("cancel");
    let holder = provider(&hosts).await;
    let waiters = provider(&hosts).await;
    let guard = semaphore(&holder, &name, 1).lock().await.unwrap();
    let nodes = Nodes::new(&holder, &name).await;
    // The head waiter (internal lock and a lease node) and one behind it
    // (queued in `locks`).
    let head = tokio::spawn({
        let sem = semaphore(&waiters, &name, 1);
        async move { sem.lock().await }
    });
    nodes.settle((1, 2), SLACK).await;
    let behind = tokio::spawn({
        let sem = semaphore(&waiters, &name, 1);
        async move { sem.lock().await }
    });
    nodes.settle((2, 2), SLACK).await;
    behind.abort();
    nodes.settle((1, 2), SLACK).await;
    head.abort();
    nodes.settle((0, 1), SLACK).await;
    // A wait that times out leaves nothing either.
    let started = Instant::now();
    let timed_out = semaphore(&waiters, &name, 1)
        .lock_timeout(Duration::from_millis(400))
        .await
        .unwrap();
    assert!(timed_out.is_none());
    assert!(started.elapsed() >= Duration::from_millis(400));
    nodes.settle((0, 1), SLACK).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
    let g = semaphore(&waiters, &name, 1)
        .try_lock()
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_when_full_returns_none_promptly_and_leaves_nothing() {
    let hosts = hosts();
    let name = unique_name("try");
    let a = provider(&hosts).await;
    let b = provider(&hosts).await;
    let sem = semaphore(&a, &name, 2);
    let g1 = sem.try_lock().await.unwrap().expect("first permit");
    let g2 = semaphore(&b, &name, 2)
        .try_lock()
        .await
        .unwrap()
        .expect("second permit");
    let nodes = Nodes::new(&a, &name).await;
    for p in [&a, &b] {
        let started = Instant::now();
        assert!(semaphore(p, &name, 2).try_lock().await.unwrap().is_none());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "try_lock waited {:?}",
            started.elapsed()
        );
        nodes.settle((0, 2), SLACK).await;
    }
    // A try behind a waiter (which holds the internal lock) is refused too.
    let waiting = tokio::spawn({
        let sem = semaphore(&b, &name, 2);
        async move { sem.lock().await }
    });
    nodes.settle((1, 3), SLACK).await;
    assert!(sem.try_lock().await.unwrap().is_none());
    nodes.settle((1, 3), SLACK).await;
    g1.release().await.unwrap();
    let g3 = tokio::time::timeout(SLACK, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    g2.release().await.unwrap();
    g3.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permits_mismatch_is_a_typed_error_and_changes_nothing() {
    let hosts = hosts();
    let name = unique_name("mismatch");
    let a = provider(&hosts).await;
    let b = provider(&hosts).await;
    let guard = semaphore(&a, &name, 2).lock().await.unwrap();
    let nodes = Nodes::new(&a, &name).await;
    let before = nodes.children("leases").await;
    let three = semaphore(&b, &name, 3);
    for attempt in 0..2 {
        let err = if attempt == 0 {
            three.try_lock().await.unwrap_err()
        } else {
            three.lock_timeout(SLACK).await.unwrap_err()
        };
        match err {
            Error::PermitsMismatch {
                name: n,
                held,
                asked,
            } => {
                assert_eq!(n, name);
                assert_eq!((held, asked), (2, 3));
            }
            other => panic!("not a permits mismatch: {other:?}"),
        }
        assert_eq!(
            nodes.counts().await,
            (0, 1),
            "the failed acquisition left a node"
        );
        assert_eq!(nodes.children("leases").await, before);
    }
    assert!(guard.is_held());
    // The other permit is still there for those who agree.
    let second = semaphore(&b, &name, 2).try_lock().await.unwrap();
    assert!(second.is_some(), "the mismatch took a permit");
    drop(second);
    guard.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
    // Nothing held: the next holder's number applies.
    let g = three.try_lock().await.unwrap().expect("free");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter() {
    const WAITERS: usize = 6;
    let hosts = hosts();
    let name = unique_name("one-wake");
    let holder = provider(&hosts).await;
    let waiters = provider(&hosts).await;
    let mut held = vec![semaphore(&holder, &name, 1).lock().await.unwrap()];
    let nodes = Nodes::new(&holder, &name).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let sem = semaphore(&waiters, &name, 1);
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let g = sem.lock().await.unwrap();
            tx.send(g).unwrap();
        }));
        // Waiter i queues before waiter i + 1.
        nodes.settle((i + 1, 2), SLACK).await;
    }
    let mut total = 0;
    for released in 0..WAITERS {
        let before = waiters.watch_events();
        held.pop().unwrap().release().await.unwrap();
        let next = tokio::time::timeout(SLACK, rx.recv())
            .await
            .expect("no waiter got the released permit")
            .unwrap();
        held.push(next);
        // The next head waiter (if any) has taken the internal lock and
        // made its lease node.
        let left = WAITERS - released - 1;
        nodes.settle((left, 1 + usize::from(left > 0)), SLACK).await;
        let woken = waiters.watch_events() - before;
        total += woken;
        // The head's `leases` watch, and its successor's watch on its
        // internal lock node: never one per waiter. None when the head
        // listed the leases after this release (its lease node is made
        // before it lists; the settle above sees only the node).
        assert!(
            woken <= 2,
            "{woken} notifications for one release with {left} waiters left"
        );
    }
    // Waiting is notification-driven: the hand-overs came by watches.
    assert!(total >= 1, "no watch event in {WAITERS} hand-overs");
    held.pop().unwrap().release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    nodes.settle((0, 0), SLACK).await;
}

/// Waits until the proxy swallows a reply, then cuts the connection: the
/// client sees a connection loss for a request that took effect.
async fn cut_once_swallowed(proxy: &Proxy) {
    let deadline = Instant::now() + SLACK;
    while !proxy.losing_replies() {
        assert!(Instant::now() < deadline, "the armed request never came");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    proxy.cut();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_create_reply_leaves_exactly_one_lease_node() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("lostreply");
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(Duration::from_secs(20))
            .operation_timeout(Duration::from_millis(800)),
    )
    .await
    .unwrap();
    let sem = semaphore(&victim, &name, 2);
    // Parents first, so the request below is the lease node's create.
    sem.lock().await.unwrap().release().await.unwrap();
    let nodes = Nodes::new(&victim, &name).await;
    nodes.settle((0, 0), SLACK).await;
    // Only the create of a lease node carries this in its path (its
    // lookup lists `…/leases`).
    proxy.lose_reply_to(b"-lease-");
    let acquiring = tokio::spawn({
        let sem = Arc::clone(&sem);
        async move { sem.lock_timeout(Duration::from_secs(5)).await }
    });
    cut_once_swallowed(&proxy).await;
    let guard = tokio::time::timeout(Duration::from_secs(5) + SLACK, acquiring)
        .await
        .expect("the acquisition outlived its timeout")
        .unwrap()
        .unwrap()
        .expect("its own lease node, found again, holds a permit");
    let leases = nodes.children("leases").await;
    assert_eq!(leases.len(), 1, "a second lease node: {leases:?}");
    nodes.settle((0, 1), SLACK).await;
    assert!(guard.is_held());
    // The other permit is free: the lost reply did not take two.
    let other = provider(&zk.connect_string()).await;
    let second = semaphore(&other, &name, 2).try_lock().await.unwrap();
    assert!(second.is_some(), "two permits taken");
    let third = semaphore(&other, &name, 2).try_lock().await.unwrap();
    assert!(third.is_none(), "three holders of two permits");
    drop(second);
    guard.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
}

/// A running Curator peer, its output lines read as they come.
struct Peer {
    child: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Peer {
    fn spawn(hosts: &str, path: &str, args: &[&str]) -> Self {
        let mut child = test_support::curator::spawn("CuratorSemaphorePeer", hosts, path, args);
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line.trim().to_owned()).is_err() {
                    return;
                }
            }
        });
        Peer { child, lines }
    }

    async fn expect(&mut self, want: &str, within: Duration) {
        let line = tokio::time::timeout(within, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("Curator did not say {want:?} in {within:?}"));
        assert_eq!(line.as_deref(), Some(want));
    }

    /// Nothing said for `quiet`.
    async fn silent(&mut self, quiet: Duration) {
        if let Ok(line) = tokio::time::timeout(quiet, self.lines.recv()).await {
            panic!("Curator said {line:?}");
        }
    }

    /// Tells a `hold` peer to return its lease now.
    fn release(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"release\n").unwrap();
        stdin.flush().unwrap();
    }

    async fn finish(self) {
        let out = tokio::task::spawn_blocking(move || self.child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            out.status.success(),
            "Curator peer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

async fn curator_try(hosts: &str, path: &str, permits: &str) -> String {
    test_support::curator::run("CuratorSemaphorePeer", hosts, path, &["try", permits]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_distlock_share_the_permits() {
    let hosts = hosts();
    let locks = provider(&hosts).await;
    let name = unique_name("curator-share");
    let path = locks.path(&name).unwrap();
    let sem = semaphore(&locks, &name, 2);
    let nodes = Nodes::new(&locks, &name).await;

    // Curator alone sees our lease: one of its two permits is free.
    let ours = sem.lock().await.unwrap();
    assert_eq!(curator_try(&hosts, &path, "2").await, "acquired");
    // Curator holds the second permit: a third holder of either library
    // is refused.
    let mut curator = Peer::spawn(&hosts, &path, &["hold", "2", "30"]);
    curator.expect("acquired", JVM).await;
    nodes.settle((0, 2), SLACK).await;
    assert!(sem.try_lock().await.unwrap().is_none(), "a third holder");
    assert!(
        semaphore(&provider(&hosts).await, &name, 2)
            .lock_timeout(Duration::from_millis(500))
            .await
            .unwrap()
            .is_none(),
        "a third holder"
    );
    assert_eq!(curator_try(&hosts, &path, "2").await, "busy");
    nodes.settle((0, 2), SLACK).await;
    ours.release().await.unwrap();
    assert_eq!(curator_try(&hosts, &path, "2").await, "acquired");
    // Curator's lease node is counted, not mistaken for ours: no mismatch.
    let again = sem.try_lock().await.unwrap().expect("the freed permit");
    again.release().await.unwrap();
    curator.release();
    curator.expect("released", SLACK).await;
    curator.finish().await;
    nodes.settle((0, 0), SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distlock_release_lets_a_waiting_curator_in() {
    let hosts = hosts();
    let locks = provider(&hosts).await;
    let name = unique_name("curator-waits");
    let path = locks.path(&name).unwrap();
    let sem = semaphore(&locks, &name, 2);
    let nodes = Nodes::new(&locks, &name).await;
    let first = sem.lock().await.unwrap();
    let second = sem.lock().await.unwrap();
    let mut curator = Peer::spawn(&hosts, &path, &["hold", "2", "0.5"]);
    // Curator queues: its internal lock node and its lease node are there.
    nodes.settle((1, 3), JVM).await;
    curator.silent(Duration::from_millis(500)).await;
    first.release().await.unwrap();
    curator.expect("acquired", SLACK).await;
    curator.expect("released", SLACK).await;
    curator.finish().await;
    nodes.settle((0, 1), SLACK).await;
    second.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_release_lets_a_waiting_distlock_in() {
    let hosts = hosts();
    let locks = provider(&hosts).await;
    let name = unique_name("distlock-waits");
    let path = locks.path(&name).unwrap();
    let sem = semaphore(&locks, &name, 2);
    let nodes = Nodes::new(&locks, &name).await;
    let ours = sem.lock().await.unwrap();
    let mut curator = Peer::spawn(&hosts, &path, &["hold", "2", "2"]);
    curator.expect("acquired", JVM).await;
    let waiting = tokio::spawn({
        let sem = Arc::clone(&sem);
        async move { sem.lock_timeout(Duration::from_secs(30)).await }
    });
    nodes.settle((1, 3), SLACK).await;
    let got = tokio::time::timeout(Duration::from_secs(2) + SLACK, waiting)
        .await
        .expect("Curator's release did not let the waiter in")
        .unwrap()
        .unwrap()
        .expect("a permit");
    curator.expect("released", SLACK).await;
    curator.finish().await;
    got.release().await.unwrap();
    ours.release().await.unwrap();
    nodes.settle((0, 0), SLACK).await;
}
