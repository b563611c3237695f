//! The ZooKeeper read-write lock on a real server: readers share across
//! clients, a writer is alone, a waiting writer holds back later readers,
//! the fencing rule, a reader's session frees its share, cancelled waiters
//! leave no node, a lost create reply never makes a second node; and interop
//! with Apache Curator 5.4's `InterProcessReadWriteLock` both ways.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_core::{Error, Lock, LockGuard, LostReason, Provider};
use distlock_zk::zookeeper_client;
use distlock_zk::{ZkOptions, ZkProvider};
use test_support::{unique_name, Proxy};

const SLACK: Duration = Duration::from_secs(5);

fn hosts() -> String {
    test_support::zookeeper::shared().connect_string()
}

async fn provider(hosts: &str) -> ZkProvider {
    ZkProvider::connect_with(ZkOptions::new(hosts))
        .await
        .unwrap()
}

fn read(p: &ZkProvider, name: &str) -> Arc<dyn Lock> {
    p.rw_lock(name).unwrap().read()
}

fn write(p: &ZkProvider, name: &str) -> Arc<dyn Lock> {
    p.rw_lock(name).unwrap().write()
}

/// The lock's nodes, sorted by name, as an operator sees them.
struct Nodes {
    client: zookeeper_client::Client,
    dir: String,
}

impl Nodes {
    async fn of(p: &ZkProvider, name: &str) -> Nodes {
        Nodes {
            client: zookeeper_client::Client::connect(&hosts()).await.unwrap(),
            dir: p.path(name).unwrap(),
        }
    }

    async fn list(&self) -> Vec<String> {
        let mut children = match self.client.list_children(&self.dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {}: {e}", self.dir),
        };
        children.sort();
        children
    }

    /// How many nodes there are of `kind` (`__READ__`, `__WRIT__`).
    async fn count(&self, kind: &str) -> usize {
        self.list()
            .await
            .iter()
            .filter(|n| n.contains(kind))
            .count()
    }

    /// Waits until the lock has `reads` read and `writes` write nodes.
    async fn until(&self, reads: usize, writes: usize) {
        until(
            &format!("{reads} read and {writes} write nodes"),
            || async {
                let nodes = self.list().await;
                let r = nodes.iter().filter(|n| n.contains("__READ__")).count();
                let w = nodes.iter().filter(|n| n.contains("__WRIT__")).count();
                r == reads && w == writes && r + w == nodes.len()
            },
        )
        .await;
    }
}

/// Waits until `cond` holds, for at most [`SLACK`] (plus JVM start-up).
async fn until<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = Instant::now() + SLACK * 4;
    while !cond().await {
        assert!(Instant::now() < deadline, "never came: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Curator's node name: `_c_<uuid>-<kind><seq10>`.
fn is_curator_name(node: &str, kind: &str) -> bool {
    let Some((protection, seq)) = node.split_once(kind) else {
        return false;
    };
    protection.len() == "_c_".len() + 36 + 1
        && protection.starts_with("_c_")
        && protection.ends_with('-')
        && seq.len() == 10
        && seq.bytes().all(|b| b.is_ascii_digit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_across_clients_and_a_writer_excludes_everyone() {
    let (a, b) = (provider(&hosts()).await, provider(&hosts()).await);
    let name = unique_name("rw-share");
    let nodes = Nodes::of(&a, &name).await;

    let r1 = read(&a, &name).lock().await.unwrap();
    let r2 = read(&b, &name)
        .try_lock()
        .await
        .unwrap()
        .expect("readers share");
    let listed = nodes.list().await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed.iter().all(|n| is_curator_name(n, "__READ__")),
        "{listed:?}"
    );
    assert!(write(&b, &name).try_lock().await.unwrap().is_none());
    assert!(write(&a, &name).try_lock().await.unwrap().is_none());
    r1.release().await.unwrap();
    assert!(write(&b, &name).try_lock().await.unwrap().is_none());
    r2.release().await.unwrap();

    let w = write(&a, &name).try_lock().await.unwrap().expect("free");
    let listed = nodes.list().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(is_curator_name(&listed[0], "__WRIT__"), "{listed:?}");
    assert!(read(&b, &name).try_lock().await.unwrap().is_none());
    assert!(read(&a, &name).try_lock().await.unwrap().is_none());
    assert!(write(&b, &name).try_lock().await.unwrap().is_none());
    assert!(read(&b, &name)
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    // Nothing of the refused attempts is left.
    assert_eq!(nodes.list().await, listed);
    w.release().await.unwrap();
    let r = read(&b, &name).try_lock().await.unwrap().expect("free");
    r.release().await.unwrap();
    nodes.until(0, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_later_readers() {
    let (a, b, c) = (
        provider(&hosts()).await,
        provider(&hosts()).await,
        provider(&hosts()).await,
    );
    let name = unique_name("rw-no-starvation");
    let nodes = Nodes::of(&a, &name).await;
    let first = read(&a, &name).lock().await.unwrap();

    let writer = {
        let lock = write(&b, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await })
    };
    nodes.until(1, 1).await;
    // A reader that comes after the waiting writer waits behind it, though
    // only readers hold now.
    assert!(read(&c, &name).try_lock().await.unwrap().is_none());
    assert!(read(&a, &name).try_lock().await.unwrap().is_none());
    let reader = {
        let lock = read(&c, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK * 3).await })
    };
    nodes.until(2, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!reader.is_finished(), "the later reader did not wait");
    assert!(!writer.is_finished(), "the writer did not wait");

    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let w = writer.await.unwrap().unwrap().expect("the writer's turn");
    assert!(w.fencing_token() > first_token);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !reader.is_finished(),
        "the reader held alongside the writer"
    );
    let w_token = w.fencing_token();
    w.release().await.unwrap();
    let r = reader.await.unwrap().unwrap().expect("the reader's turn");
    assert!(r.fencing_token() > w_token);
    r.release().await.unwrap();
    nodes.until(0, 0).await;
}

/// A hold of the fencing test: whether it writes, its token, when it began.
type Hold = (bool, u64, Instant);

/// Acquires `lock` (the write side if `write`) and notes when the hold
/// began.
async fn timed(write: bool, lock: Arc<dyn Lock>) -> (Hold, LockGuard) {
    let g = lock.lock_timeout(SLACK * 2).await.unwrap().expect("a turn");
    ((write, g.fencing_token(), Instant::now()), g)
}

/// Releases the guard and keeps its hold.
async fn done(seen: &mut Vec<Hold>, (hold, g): (Hold, LockGuard)) {
    g.release().await.unwrap();
    seen.push(hold);
}

/// A mixed sequence over two clients, checked by when each hold began:
/// every write token is greater than every earlier token, every read token
/// greater than every earlier write token; all distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_follow_the_read_write_rule() {
    let (a, b) = (provider(&hosts()).await, provider(&hosts()).await);
    let name = unique_name("rw-fencing");
    let mut seen: Vec<Hold> = Vec::new();
    for round in 0..3 {
        let (x, y) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let nodes = Nodes::of(x, &name).await;
        let r1 = timed(false, read(x, &name)).await;
        let r2 = timed(false, read(y, &name)).await;
        // A writer queues behind both readers, a reader behind the writer.
        let writer = tokio::spawn(timed(true, write(y, &name)));
        nodes.until(2, 1).await;
        let reader = tokio::spawn(timed(false, read(x, &name)));
        nodes.until(3, 1).await;
        done(&mut seen, r2).await;
        done(&mut seen, r1).await;
        done(&mut seen, writer.await.unwrap()).await;
        let r3 = reader.await.unwrap();
        let r4 = timed(false, read(y, &name)).await;
        // A writer behind two readers again, released in the other order.
        let writer = tokio::spawn(timed(true, write(x, &name)));
        nodes.until(2, 1).await;
        done(&mut seen, r3).await;
        done(&mut seen, r4).await;
        done(&mut seen, writer.await.unwrap()).await;
    }
    assert_eq!(seen.len(), 18);
    seen.sort_by_key(|&(_, _, at)| at);
    for (i, &(write, token, _)) in seen.iter().enumerate() {
        for &(earlier_write, earlier, _) in &seen[..i] {
            assert_ne!(token, earlier);
            if write || earlier_write {
                assert!(
                    token > earlier,
                    "{} token {token} not above an earlier {} token {earlier}",
                    if write { "write" } else { "read" },
                    if earlier_write { "write" } else { "read" },
                );
            }
        }
    }
}

/// Each waiter watches only the node it must outlast: a reader behind two
/// writers is not woken when the first of them leaves, only when the last
/// one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_woken_once_by_the_last_writer_before_it() {
    let (a, b, c) = (
        provider(&hosts()).await,
        provider(&hosts()).await,
        provider(&hosts()).await,
    );
    let name = unique_name("rw-no-herd");
    let nodes = Nodes::of(&a, &name).await;
    let w1 = write(&a, &name).lock().await.unwrap();
    let w2 = {
        let lock = write(&b, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await })
    };
    nodes.until(0, 2).await;
    let reader = {
        let lock = read(&c, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK * 3).await })
    };
    nodes.until(1, 2).await;
    let woken = c.watch_events();
    w1.release().await.unwrap();
    let w2 = w2
        .await
        .unwrap()
        .unwrap()
        .expect("the second writer's turn");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.watch_events(), woken, "the reader woke for nothing");
    assert!(!reader.is_finished());
    w2.release().await.unwrap();
    let r = reader.await.unwrap().unwrap().expect("the reader's turn");
    assert_eq!(c.watch_events(), woken + 1);
    r.release().await.unwrap();
}

/// A directory whose sequence counter passed `i32::MAX` is a typed
/// conflict for both sides, and nothing of ours is left in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_sequence_is_a_conflict() {
    let locks = provider(&hosts()).await;
    let name = unique_name("rw-wrapped");
    let nodes = Nodes::of(&locks, &name).await;
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    nodes.client.mkdir(&nodes.dir, &open).await.unwrap();
    let wrapped = "_c_x-__WRIT__-2147483648";
    nodes
        .client
        .create(&format!("{}/{wrapped}", nodes.dir), b"", &open)
        .await
        .unwrap();
    for lock in [read(&locks, &name), write(&locks, &name)] {
        let r = tokio::time::timeout(SLACK, lock.try_lock())
            .await
            .expect("looped on a wrapped sequence");
        assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
        assert_eq!(nodes.list().await, vec![wrapped.to_owned()]);
    }
}

/// A reader's share is its session's: closing the reader's provider or
/// losing its session frees a waiting writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_share_ends_with_its_session() {
    let name = unique_name("rw-session");
    let other = provider(&hosts()).await;
    // Closed: a long session, so only the close can free the writer in time.
    let closing =
        ZkProvider::connect_with(ZkOptions::new(hosts()).session_timeout(Duration::from_secs(30)))
            .await
            .unwrap();
    let r = read(&closing, &name).lock().await.unwrap();
    let lost = r.lost();
    let writer = {
        let lock = write(&other, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK).await })
    };
    Nodes::of(&other, &name).await.until(1, 1).await;
    // A waiter of the closing provider gives up with Closed.
    let waiting = {
        let lock = write(&closing, &name);
        tokio::spawn(async move { lock.lock().await })
    };
    Nodes::of(&other, &name).await.until(1, 2).await;
    closing.close().await.unwrap();
    assert!(matches!(waiting.await.unwrap(), Err(Error::Closed)));
    let w = writer
        .await
        .unwrap()
        .unwrap()
        .expect("the closed reader's share was not freed");
    assert_eq!(
        tokio::time::timeout(SLACK, lost).await.unwrap(),
        LostReason::ProviderClosed
    );
    w.release().await.unwrap();

    // Expired: the reader's connection is blackholed until its session ends.
    let proxy = Proxy::start(test_support::zookeeper::shared().addr(0));
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string()).session_timeout(Duration::from_millis(1000)),
    )
    .await
    .unwrap();
    let timeout = victim.session_timeout().await.unwrap();
    let r = read(&victim, &name).lock().await.unwrap();
    let lost = r.lost();
    let writer = {
        let lock = write(&other, &name);
        tokio::spawn(async move { lock.lock_timeout(timeout * 3 + SLACK).await })
    };
    Nodes::of(&other, &name).await.until(1, 1).await;
    proxy.set_blackhole(true);
    let w = writer
        .await
        .unwrap()
        .unwrap()
        .expect("the expired reader's share was not freed");
    assert!(w.fencing_token() > r.fencing_token());
    assert!(!r.is_held());
    assert!(matches!(
        tokio::time::timeout(SLACK, lost).await.unwrap(),
        LostReason::Expired | LostReason::SessionExpired
    ));
    w.release().await.unwrap();
    proxy.heal();
}

/// Waiters that time out, find the lock taken, or are cancelled while
/// queued leave no node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_or_are_cancelled_leave_no_node() {
    let (a, b) = (provider(&hosts()).await, provider(&hosts()).await);
    let name = unique_name("rw-cancel");
    let nodes = Nodes::of(&a, &name).await;
    for holder_writes in [true, false] {
        let (held_lock, waiter) = if holder_writes {
            (write(&a, &name), read(&b, &name))
        } else {
            (read(&a, &name), write(&b, &name))
        };
        let (reads, writes) = if holder_writes { (0, 1) } else { (1, 0) };
        let g = held_lock.lock().await.unwrap();
        assert!(waiter.try_lock().await.unwrap().is_none());
        nodes.until(reads, writes).await;
        assert!(waiter
            .lock_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none());
        nodes.until(reads, writes).await;
        // Cancelled while it waits in the queue.
        let task = {
            let waiter = Arc::clone(&waiter);
            tokio::spawn(async move { waiter.lock().await })
        };
        // The waiter's node is of the other kind.
        nodes.until(1, 1).await;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        nodes.until(reads, writes).await;
        g.release().await.unwrap();
        nodes.until(0, 0).await;
    }
}

/// The reply to the writer's create is lost and the connection cut: the
/// writer finds its node again by its `_c_<uuid>-` prefix and waits with
/// it, never making a second one, and holds once the reader leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_is_found_again_never_doubled() {
    let zk = test_support::zookeeper::shared();
    let proxy = Proxy::start(zk.addr(0));
    let name = unique_name("rw-lost-reply");
    let holder = provider(&zk.connect_string()).await;
    let victim = ZkProvider::connect_with(
        ZkOptions::new(proxy.addr().to_string())
            .session_timeout(Duration::from_secs(20))
            .operation_timeout(Duration::from_millis(800)),
    )
    .await
    .unwrap();
    let nodes = Nodes::of(&holder, &name).await;
    let r = read(&holder, &name).lock().await.unwrap();
    proxy.lose_reply_to(b"__WRIT__");
    let writer = {
        let lock = write(&victim, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK * 2).await })
    };
    until("the create's reply swallowed", || async {
        proxy.losing_replies()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    proxy.cut();
    // The victim reconnects and looks; it must not create again.
    let watching = Instant::now();
    while watching.elapsed() < Duration::from_millis(2500) {
        assert!(
            nodes.count("__WRIT__").await <= 1,
            "{:?}",
            nodes.list().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodes.until(1, 1).await;
    assert!(!writer.is_finished(), "the writer did not wait");
    r.release().await.unwrap();
    let w = writer.await.unwrap().unwrap().expect("the writer's turn");
    nodes.until(0, 1).await;
    w.release().await.unwrap();
    nodes.until(0, 0).await;
}

fn curator(path: &str, args: &[&str]) -> std::process::Child {
    test_support::curator::spawn("CuratorRwPeer", &hosts(), path, args)
}

async fn run_curator(path: &str, args: &[&str]) -> String {
    test_support::curator::run("CuratorRwPeer", &hosts(), path, args).await
}

async fn curator_output(child: std::process::Child) -> String {
    tokio::task::spawn_blocking(move || test_support::curator::output(child))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_writer_excludes_distlock_readers_and_writers() {
    let locks = provider(&hosts()).await;
    let name = unique_name("rw-curator-writer");
    let path = locks.path(&name).unwrap();
    let nodes = Nodes::of(&locks, &name).await;
    let holder = curator(&path, &["write-hold", "2"]);
    // Curator's node is there once the JVM has started.
    nodes.until(0, 1).await;
    assert!(
        is_curator_name(&nodes.list().await[0], "__WRIT__"),
        "{:?}",
        nodes.list().await
    );
    assert!(read(&locks, &name).try_lock().await.unwrap().is_none());
    assert!(write(&locks, &name).try_lock().await.unwrap().is_none());
    let r = read(&locks, &name)
        .lock_timeout(SLACK * 2)
        .await
        .unwrap()
        .expect("Curator's release not seen");
    // Curator released before the reader held.
    assert_eq!(curator_output(holder).await, "acquired\nreleased");
    r.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distlock_writer_excludes_curator_readers_and_writers() {
    let locks = provider(&hosts()).await;
    let name = unique_name("rw-distlock-writer");
    let path = locks.path(&name).unwrap();
    let w = write(&locks, &name).lock().await.unwrap();
    assert_eq!(run_curator(&path, &["read-try"]).await, "busy");
    assert_eq!(run_curator(&path, &["write-try"]).await, "busy");
    w.release().await.unwrap();
    assert_eq!(
        run_curator(&path, &["read-try"]).await,
        "acquired\nreleased"
    );
    assert_eq!(
        run_curator(&path, &["write-try"]).await,
        "acquired\nreleased"
    );
    let r = read(&locks, &name).lock().await.unwrap();
    assert_eq!(run_curator(&path, &["write-try"]).await, "busy");
    r.release().await.unwrap();
    Nodes::of(&locks, &name).await.until(0, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_and_curator_readers_share_and_queue_behind_each_others_writers() {
    let locks = provider(&hosts()).await;
    let name = unique_name("rw-curator-readers");
    let path = locks.path(&name).unwrap();
    let nodes = Nodes::of(&locks, &name).await;

    let r = read(&locks, &name).lock().await.unwrap();
    assert_eq!(
        run_curator(&path, &["read-try"]).await,
        "acquired\nreleased"
    );
    // A Curator reader holds alongside ours.
    let curator_reader = curator(&path, &["read-hold", "1"]);
    nodes.until(2, 0).await;
    let r2 = read(&locks, &name)
        .try_lock()
        .await
        .unwrap()
        .expect("readers share");
    assert!(write(&locks, &name).try_lock().await.unwrap().is_none());
    assert_eq!(curator_output(curator_reader).await, "acquired\nreleased");
    r2.release().await.unwrap();

    // A Curator writer waits behind our reader and holds back our later
    // readers (no starvation across implementations).
    let curator_writer = curator(&path, &["write-hold", "2"]);
    nodes.until(1, 1).await;
    assert!(read(&locks, &name).try_lock().await.unwrap().is_none());
    let later = {
        let lock = read(&locks, &name);
        tokio::spawn(async move { lock.lock_timeout(SLACK * 3).await })
    };
    nodes.until(2, 1).await;
    r.release().await.unwrap();
    // Curator's writer holds now (ours gone, it and the later reader left):
    // the later reader still waits.
    nodes.until(1, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !later.is_finished(),
        "a reader held alongside Curator's writer"
    );
    let out = curator_output(curator_writer).await;
    assert_eq!(out, "acquired\nreleased");
    let r3 = later
        .await
        .unwrap()
        .unwrap()
        .expect("the reader behind Curator's writer");
    r3.release().await.unwrap();
    nodes.until(0, 0).await;
}
