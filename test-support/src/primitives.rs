//! Conformance sections for the primitives beyond the mutex: the read-write
//! lock, the counting semaphore, the fair mutex's order, and leader
//! election. Written once, run on every backend through
//! [`conformance_suite!`](crate::conformance_suite) (`rw`, `semaphore`,
//! `fair`, `election` arms).
//!
//! The write side of a read-write lock and a semaphore of 1 also run the
//! whole mutex suite: see [`Kind`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{
    Error, LeaderInfo, LeaseOptions, Lock, LockGuard, Provider, ReadWriteLock, Semaphore,
};
use futures::StreamExt;

use crate::conformance::{Fixture, SLACK};
use crate::unique_name;

/// Which primitive a mutex-suite fixture opens: every primitive that can
/// act as a mutex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// [`Provider::mutex`].
    Mutex,
    /// [`Provider::fair_mutex`].
    FairMutex,
    /// The write side of [`Provider::rw_lock`].
    RwWrite,
    /// [`Provider::semaphore`] with one permit.
    Semaphore1,
}

impl Kind {
    /// Opens this primitive named `name` on `client`'s view with `lease`
    /// ([`Provider::with_lease`]).
    ///
    /// # Errors
    ///
    /// Whatever the provider returns (a bad name, refused lease options).
    pub fn open(
        self,
        client: &dyn Provider,
        name: &str,
        lease: LeaseOptions,
    ) -> distlock_core::Result<Arc<dyn Lock>> {
        let view = client.with_lease(lease)?;
        match self {
            Kind::Mutex => view.mutex(name),
            Kind::FairMutex => view.fair_mutex(name),
            Kind::RwWrite => Ok(view.rw_lock(name)?.write()),
            Kind::Semaphore1 => Ok(view.semaphore(name, 1)? as Arc<dyn Lock>),
        }
    }
}

/// `wanted`, or the provider's own lease for a backend whose lease is the
/// session.
fn lease<F: Fixture>(fx: &F, client: &dyn Provider, wanted: LeaseOptions) -> LeaseOptions {
    if fx.session() {
        client.default_lease()
    } else {
        wanted
    }
}

fn long() -> LeaseOptions {
    LeaseOptions::new(Duration::from_secs(60)).expect("valid TTL")
}

async fn clients<F: Fixture>(fx: &F, n: usize) -> Vec<Arc<dyn Provider>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(fx.client().await);
    }
    out
}

fn rw<F: Fixture>(fx: &F, client: &dyn Provider, name: &str) -> Arc<dyn ReadWriteLock> {
    client
        .with_lease(lease(fx, client, long()))
        .expect("lease")
        .rw_lock(name)
        .expect("rw_lock")
}

fn sem<F: Fixture>(fx: &F, client: &dyn Provider, name: &str, n: u32) -> Arc<dyn Semaphore> {
    client
        .with_lease(lease(fx, client, long()))
        .expect("lease")
        .semaphore(name, n)
        .expect("semaphore")
}

async fn must_get(lock: &dyn Lock, what: &str) -> LockGuard {
    lock.lock_timeout(SLACK * 2)
        .await
        .expect("acquire")
        .unwrap_or_else(|| panic!("{what}: not acquired within {:?}", SLACK * 2))
}

async fn must_not_get(lock: &dyn Lock, what: &str) {
    let got = lock.try_lock().await.expect("try_lock");
    assert!(got.is_none(), "{what}");
}

/// Waits until `lock.try_lock()` gives `None` (something queued or held
/// makes it wait), releasing what it took meanwhile.
async fn until_refused(lock: &dyn Lock, what: &str) {
    let deadline = Instant::now() + SLACK * 2;
    loop {
        match lock.try_lock().await.expect("try_lock") {
            None => return,
            Some(g) => g.release().await.expect("release"),
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- rw lock

/// Readers of several clients hold at once; a writer is refused while any
/// reads, and gets in when the last reader leaves.
pub async fn rw_readers_share<F: Fixture>(fx: &F) {
    let name = unique_name("rw_share");
    let c = clients(fx, 3).await;
    let mut readers = Vec::new();
    for client in &c {
        let r = rw(fx, client.as_ref(), &name)
            .read()
            .try_lock()
            .await
            .expect("try read")
            .expect("readers share");
        assert!(r.is_held());
        readers.push(r);
    }
    let writer = rw(fx, c[0].as_ref(), &name).write();
    must_not_get(writer.as_ref(), "a writer got in while three read").await;
    let last = readers.pop().expect("three readers");
    for r in readers {
        r.release().await.expect("release");
    }
    must_not_get(writer.as_ref(), "a writer got in while one read").await;
    last.release().await.expect("release");
    let w = writer
        .try_lock()
        .await
        .expect("try write")
        .expect("free after the readers left");
    w.release().await.expect("release");
}

/// A writer excludes readers and writers of every client, and is not
/// reentrant.
pub async fn rw_writer_excludes<F: Fixture>(fx: &F) {
    let name = unique_name("rw_excl");
    let c = clients(fx, 2).await;
    let mine = rw(fx, c[0].as_ref(), &name);
    let theirs = rw(fx, c[1].as_ref(), &name);
    let w = mine.write().lock().await.expect("write");
    must_not_get(theirs.read().as_ref(), "a reader got in under a writer").await;
    must_not_get(theirs.write().as_ref(), "two writers").await;
    must_not_get(mine.read().as_ref(), "a reader of the writer's own client").await;
    let start = Instant::now();
    let timed = theirs
        .read()
        .lock_timeout(Duration::from_millis(300))
        .await
        .expect("read timeout");
    assert!(timed.is_none(), "read acquired under a writer");
    assert!(start.elapsed() >= Duration::from_millis(300));
    w.release().await.expect("release");
    let r = must_get(theirs.read().as_ref(), "reader after the writer left").await;
    r.release().await.expect("release");
}

/// Once a writer waits, new readers wait behind it: the writer gets in when
/// the readers before it leave, then the held-back reader.
pub async fn rw_no_writer_starvation<F: Fixture>(fx: &F) {
    let name = unique_name("rw_starve");
    let c = clients(fx, 3).await;
    let first = rw(fx, c[0].as_ref(), &name)
        .read()
        .lock()
        .await
        .expect("first reader");
    let writer = rw(fx, c[1].as_ref(), &name).write();
    let order = Arc::new(Mutex::new(Vec::new()));
    let w_order = Arc::clone(&order);
    let waiting_writer = tokio::spawn(async move {
        let g = writer.lock().await.expect("writer");
        w_order.lock().expect("poisoned").push("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        g.release().await.expect("release");
    });
    let late = rw(fx, c[2].as_ref(), &name).read();
    // The writer is queued once a new reader is refused.
    until_refused(
        late.as_ref(),
        "a new reader still got in: the writer never queued",
    )
    .await;
    let r_order = Arc::clone(&order);
    let late_reader = tokio::spawn(async move {
        let g = late.lock().await.expect("late reader");
        r_order.lock().expect("poisoned").push("read");
        g.release().await.expect("release");
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        order.lock().expect("poisoned").is_empty(),
        "someone got in while the first reader held"
    );
    first.release().await.expect("release");
    tokio::time::timeout(SLACK * 2, waiting_writer)
        .await
        .expect("writer starved")
        .expect("task");
    tokio::time::timeout(SLACK * 2, late_reader)
        .await
        .expect("late reader never got in")
        .expect("task");
    assert_eq!(*order.lock().expect("poisoned"), ["write", "read"]);
}

/// Tokens: a write's is above every earlier read's and write's, a read's
/// above every earlier write's, readers' unique; over a random mix of
/// overlapping readers and writers from several clients.
pub async fn rw_fencing<F: Fixture>(fx: &F) {
    let name = unique_name("rw_fence");
    let c = clients(fx, 3).await;
    let locks: Vec<_> = c.iter().map(|p| rw(fx, p.as_ref(), &name)).collect();
    // (token, write?) in the order the holds began, recorded under the hold.
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, lock) in locks.into_iter().enumerate() {
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(i as u64 + 7);
            for _ in 0..40 {
                let write = rng.u8(0..4) == 0;
                let side = if write { lock.write() } else { lock.read() };
                let g = side.lock().await.expect("acquire");
                log.lock()
                    .expect("poisoned")
                    .push((g.fencing_token(), write));
                tokio::time::sleep(Duration::from_micros(rng.u64(0..500))).await;
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let log = log.lock().expect("poisoned");
    let (mut max_any, mut max_write) = (0, 0);
    let mut seen = std::collections::HashSet::new();
    for &(token, write) in log.iter() {
        assert!(seen.insert(token), "token {token} handed out twice");
        if write {
            assert!(token > max_any, "write token {token} not above {max_any}");
            max_write = token;
        } else {
            assert!(
                token > max_write,
                "read token {token} not above the last write's {max_write}"
            );
        }
        max_any = max_any.max(token);
    }
}

/// Many readers and writers over several clients: a write never overlaps a
/// read or a write, and a read never sees a write half done.
pub async fn rw_exclusion_under_load<F: Fixture>(fx: &F) {
    let name = unique_name("rw_load");
    let c = clients(fx, 4).await;
    let readers = Arc::new(AtomicU64::new(0));
    let writers = Arc::new(AtomicU64::new(0));
    let halves = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let max_readers = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let lock = rw(fx, c[t % c.len()].as_ref(), &name);
        let (readers, writers, halves, max_readers) = (
            Arc::clone(&readers),
            Arc::clone(&writers),
            Arc::clone(&halves),
            Arc::clone(&max_readers),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(t as u64);
            for _ in 0..30 {
                if rng.u8(0..5) == 0 {
                    let g = lock.write().lock().await.expect("write");
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a write overlaps a read");
                    let v = halves.0.load(Ordering::SeqCst);
                    halves.0.store(v + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    halves.1.store(v + 1, Ordering::SeqCst);
                    writers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                } else {
                    let g = lock.read().lock().await.expect("read");
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    max_readers.fetch_max(now, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "a read overlaps a write");
                    let a = halves.0.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    let b = halves.1.load(Ordering::SeqCst);
                    assert_eq!(a, b, "a read saw a write half done");
                    readers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        halves.0.load(Ordering::SeqCst),
        halves.1.load(Ordering::SeqCst)
    );
}

/// A reader that dies (its guard leaked, its lease left to run out) frees
/// its share at the end of its TTL; the writer then gets in.
pub async fn rw_dead_reader_frees_writer<F: Fixture>(fx: &F) {
    let name = unique_name("rw_dead");
    let c = clients(fx, 2).await;
    let ttl = Duration::from_millis(500);
    let dead = c[0]
        .with_lease(LeaseOptions::manual(ttl).expect("ttl"))
        .expect("lease")
        .rw_lock(&name)
        .expect("rw_lock")
        .read()
        .lock()
        .await
        .expect("read");
    let start = Instant::now();
    std::mem::forget(dead);
    let w = rw(fx, c[1].as_ref(), &name)
        .write()
        .lock_timeout(ttl + SLACK)
        .await
        .expect("write")
        .expect("a dead reader blocked the writer past its TTL");
    assert!(
        start.elapsed() >= ttl / 2,
        "the writer got in under a live read"
    );
    w.release().await.expect("release");
}

/// Cancelled and timed-out waiters (readers and writers) leave nothing: in
/// particular a cancelled writer does not hold back later readers.
pub async fn rw_cancellation<F: Fixture>(fx: &F) {
    let name = unique_name("rw_cancel");
    let c = clients(fx, 3).await;
    let holder = rw(fx, c[0].as_ref(), &name);
    let waiter = rw(fx, c[1].as_ref(), &name);
    let mut rng = fastrand::Rng::with_seed(fastrand::u64(..));
    let r = holder.read().lock().await.expect("read");
    for _ in 0..30 {
        let cut = Duration::from_micros(rng.u64(0..3000));
        assert!(
            tokio::time::timeout(cut, waiter.write().lock())
                .await
                .is_err(),
            "a writer got in under a reader"
        );
    }
    assert!(waiter
        .write()
        .lock_timeout(Duration::from_millis(100))
        .await
        .expect("timeout")
        .is_none());
    // No cancelled writer is left queued: a new reader shares at once.
    let other = rw(fx, c[2].as_ref(), &name)
        .read()
        .lock_timeout(SLACK)
        .await
        .expect("read")
        .expect("a cancelled writer held back a reader");
    other.release().await.expect("release");
    let w = holder.write();
    r.release().await.expect("release");
    w.try_lock().await.expect("try").map_or_else(
        || panic!("cancelled readers or writers left the lock held"),
        drop,
    );
    for _ in 0..50 {
        let cut = Duration::from_micros(rng.u64(0..2000));
        let _ = tokio::time::timeout(cut, waiter.read().lock()).await;
        let _ = tokio::time::timeout(cut, waiter.write().lock()).await;
    }
    let w = must_get(
        rw(fx, c[2].as_ref(), &name).write().as_ref(),
        "write after cancellations",
    )
    .await;
    w.release().await.expect("release");
}

// -------------------------------------------------------------- semaphore

/// Never more than N holders over several clients; N holders at once at
/// some point; every permit's token unique.
pub async fn semaphore_bounds<F: Fixture>(fx: &F) {
    const PERMITS: u32 = 3;
    let name = unique_name("sem_bounds");
    let c = clients(fx, 4).await;
    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let s = sem(fx, c[t % c.len()].as_ref(), &name, PERMITS);
        assert_eq!(s.permits(), PERMITS);
        let (inside, most, tokens) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&tokens));
        tasks.push(tokio::spawn(async move {
            for round in 0..25 {
                let g = s.lock().await.expect("acquire");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(
                    now <= u64::from(PERMITS),
                    "{now} holders of {PERMITS} permits"
                );
                most.fetch_max(now, Ordering::SeqCst);
                assert!(
                    tokens.lock().expect("poisoned").insert(g.fencing_token()),
                    "token handed out twice"
                );
                if round == 0 {
                    // Each first holder keeps its permit until a second
                    // holder is in (or a generous bound passes): a free
                    // permit must go to one of the waiters, however slow
                    // the machine; a 2 ms hold alone proves nothing about
                    // holding together when acquiring takes longer.
                    let bound = tokio::time::Instant::now() + Duration::from_secs(10);
                    while most.load(Ordering::SeqCst) < 2 && tokio::time::Instant::now() < bound {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "permits were never held together"
    );
}

/// `try_lock` and `lock_timeout` while every permit is out; a release
/// lets the next in; tokens increase.
pub async fn semaphore_try_and_timeout<F: Fixture>(fx: &F) {
    let name = unique_name("sem_try");
    let c = clients(fx, 3).await;
    let a = must_get(sem(fx, c[0].as_ref(), &name, 2).as_ref(), "first permit").await;
    let b = must_get(sem(fx, c[1].as_ref(), &name, 2).as_ref(), "second permit").await;
    assert!(b.fencing_token() > a.fencing_token());
    let third = sem(fx, c[2].as_ref(), &name, 2);
    must_not_get(third.as_ref(), "a third permit of two").await;
    let start = Instant::now();
    let timed = third
        .lock_timeout(Duration::from_millis(300))
        .await
        .expect("timeout");
    assert!(timed.is_none(), "a third permit of two");
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(start.elapsed() <= Duration::from_millis(300) + SLACK);
    a.release().await.expect("release");
    let g = third
        .try_lock()
        .await
        .expect("try")
        .expect("a released permit was not free");
    assert!(g.fencing_token() > b.fencing_token());
    g.release().await.expect("release");
    b.release().await.expect("release");
}

/// A client asking with another number of permits than the holders' gets
/// `PermitsMismatch` and changes nothing; once nothing is held it may.
pub async fn semaphore_permits_mismatch<F: Fixture>(fx: &F) {
    let name = unique_name("sem_mismatch");
    let c = clients(fx, 2).await;
    let held = must_get(sem(fx, c[0].as_ref(), &name, 2).as_ref(), "permit").await;
    let other = sem(fx, c[1].as_ref(), &name, 3);
    for r in [
        other.try_lock().await,
        other.lock_timeout(Duration::from_millis(200)).await,
    ] {
        assert!(
            matches!(
                r,
                Err(Error::PermitsMismatch {
                    held: 2,
                    asked: 3,
                    ..
                })
            ),
            "asked with 3 while held with 2: {r:?}"
        );
    }
    // Nothing changed: exactly one permit of two is still free.
    let second = must_get(sem(fx, c[1].as_ref(), &name, 2).as_ref(), "second of two").await;
    must_not_get(sem(fx, c[1].as_ref(), &name, 2).as_ref(), "a third of two").await;
    held.release().await.expect("release");
    second.release().await.expect("release");
    let g = must_get(other.as_ref(), "three permits once nothing is held").await;
    g.release().await.expect("release");
    let zero = c[0].semaphore(&name, 0);
    assert!(
        matches!(zero, Err(Error::InvalidOptions(_))),
        "0 permits gave {zero:?}"
    );
}

/// A permit whose holder died (its guard leaked) comes back at the end of
/// its TTL, with no operator action.
pub async fn semaphore_dead_holder_reclaimed<F: Fixture>(fx: &F) {
    let name = unique_name("sem_dead");
    let c = clients(fx, 2).await;
    let ttl = Duration::from_millis(500);
    let dead = c[0]
        .with_lease(LeaseOptions::manual(ttl).expect("ttl"))
        .expect("lease")
        .semaphore(&name, 1)
        .expect("semaphore")
        .lock()
        .await
        .expect("permit");
    let start = Instant::now();
    std::mem::forget(dead);
    let g = sem(fx, c[1].as_ref(), &name, 1)
        .lock_timeout(ttl + SLACK)
        .await
        .expect("acquire")
        .expect("a dead holder's permit was never reclaimed");
    assert!(
        start.elapsed() >= ttl / 2,
        "got a permit under a live holder"
    );
    g.release().await.expect("release");
}

/// Cancelled and timed-out acquisitions leave every permit free.
pub async fn semaphore_cancellation<F: Fixture>(fx: &F) {
    let name = unique_name("sem_cancel");
    let c = clients(fx, 3).await;
    let holder = sem(fx, c[0].as_ref(), &name, 2);
    let waiter = sem(fx, c[1].as_ref(), &name, 2);
    let mut rng = fastrand::Rng::with_seed(fastrand::u64(..));
    let a = holder.lock().await.expect("permit");
    let b = holder.lock().await.expect("permit");
    for _ in 0..30 {
        let cut = Duration::from_micros(rng.u64(0..3000));
        assert!(
            tokio::time::timeout(cut, waiter.lock()).await.is_err(),
            "a third permit of two"
        );
    }
    a.release().await.expect("release");
    b.release().await.expect("release");
    for _ in 0..50 {
        let cut = Duration::from_micros(rng.u64(0..2000));
        let _ = tokio::time::timeout(cut, waiter.lock()).await;
    }
    let third = sem(fx, c[2].as_ref(), &name, 2);
    let x = must_get(third.as_ref(), "first permit after cancellations").await;
    let y = must_get(third.as_ref(), "second permit after cancellations").await;
    x.release().await.expect("release");
    y.release().await.expect("release");
}

// ------------------------------------------------------------- fair mutex

/// Waiters of several clients get the fair mutex in the order they came.
pub async fn fair_fifo<F: Fixture>(fx: &F) {
    const WAITERS: usize = 6;
    let name = unique_name("fair_fifo");
    let c = clients(fx, 3).await;
    let open = |i: usize| {
        let client = &c[i % c.len()];
        client
            .with_lease(lease(fx, client.as_ref(), long()))
            .expect("lease")
            .fair_mutex(&name)
            .expect("fair_mutex")
    };
    let first = open(0).lock().await.expect("lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let lock = open(i + 1);
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.expect("lock");
            order.lock().expect("poisoned").push(i);
            g.release().await.expect("release");
        }));
        // Each waiter queued before the next arrives (a queue entry is one
        // round trip; this is hundreds).
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    first.release().await.expect("release");
    for t in tasks {
        tokio::time::timeout(SLACK * 3, t)
            .await
            .expect("a fair waiter never got in")
            .expect("task");
    }
    let order = order.lock().expect("poisoned");
    assert_eq!(
        *order,
        (0..WAITERS).collect::<Vec<_>>(),
        "not first come first served"
    );
}

// ---------------------------------------------------------------- election

/// One leader among candidates of several clients; `leader()` names it and
/// its term; resigning or dropping elects the next with a higher term.
pub async fn election_one_leader<F: Fixture>(fx: &F) {
    let name = unique_name("elect_one");
    let c = clients(fx, 3).await;
    let elections: Vec<_> = c
        .iter()
        .map(|p| {
            p.with_lease(lease(fx, p.as_ref(), long()))
                .expect("lease")
                .election(&name)
                .expect("election")
        })
        .collect();
    assert_eq!(elections[0].leader().await.expect("leader"), None);
    let a = elections[0].campaign("a").await.expect("campaign");
    assert!(a.is_leader());
    assert_eq!(a.candidate(), "a");
    assert_eq!(
        elections[1].leader().await.expect("leader"),
        Some(LeaderInfo {
            id: "a".into(),
            term: a.term()
        })
    );
    let (e1, e2) = (Arc::clone(&elections[1]), Arc::clone(&elections[2]));
    let b = tokio::spawn(async move { e1.campaign("b").await });
    let d = tokio::spawn(async move { e2.campaign("d").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished() && !d.is_finished(), "two leaders at once");
    let term_a = a.term();
    a.resign().await.expect("resign");
    let (next, other) = match tokio::time::timeout(SLACK * 2, futures::future::select(b, d))
        .await
        .expect("nobody was elected after a resignation")
    {
        futures::future::Either::Left((r, other)) | futures::future::Either::Right((r, other)) => {
            (r.expect("task").expect("campaign"), other)
        }
    };
    // The other candidate withdraws (its campaign is cancelled).
    other.abort();
    if let Ok(Ok(unexpected)) = other.await {
        panic!("two leaders at once: {unexpected:?} and {next:?}");
    }
    assert!(next.term() > term_a, "term did not increase");
    assert_eq!(
        elections[0].leader().await.expect("leader").map(|l| l.term),
        Some(next.term())
    );
    let term_next = next.term();
    drop(next);
    // A fresh campaign wins after the dropped leadership resigned.
    let again = tokio::time::timeout(SLACK * 2, elections[0].campaign("a2"))
        .await
        .expect("no leader after a dropped leadership")
        .expect("campaign");
    assert!(again.term() > term_next);
    again.resign().await.expect("resign");
}

/// `observe()` yields the leader now, then each change; a candidate id that
/// is empty, too long or has control characters is refused.
pub async fn election_observe<F: Fixture>(fx: &F) {
    let name = unique_name("elect_observe");
    let c = clients(fx, 2).await;
    let lease0 = lease(fx, c[0].as_ref(), long());
    let e0 = c[0]
        .with_lease(lease0)
        .expect("lease")
        .election(&name)
        .expect("election");
    let e1 = c[1]
        .with_lease(lease(fx, c[1].as_ref(), long()))
        .expect("lease")
        .election(&name)
        .expect("election");
    let mut stream = e1.observe();
    assert_eq!(
        next(&mut stream).await,
        None,
        "a leader before any campaign"
    );
    let a = e0.campaign("alpha").await.expect("campaign");
    let seen = next(&mut stream).await.expect("leader");
    assert_eq!((seen.id.as_str(), seen.term), ("alpha", a.term()));
    let term = a.term();
    a.resign().await.expect("resign");
    // After the resignation: no leader (or already the next one).
    let b = e1.campaign("beta").await.expect("campaign");
    let mut latest = next(&mut stream).await;
    while latest.as_ref().map(|l| l.id.as_str()) != Some("beta") {
        latest = next(&mut stream).await;
    }
    let latest = latest.expect("beta");
    assert!(latest.term > term && latest.term == b.term());
    b.resign().await.expect("resign");
    for bad in ["", "a\nb", &"x".repeat(257)] {
        let r = e0.campaign(bad).await;
        assert!(
            matches!(r, Err(Error::InvalidOptions(_))),
            "candidate {bad:?} gave {r:?}"
        );
    }
}

async fn next(stream: &mut distlock_core::LeaderStream) -> Option<LeaderInfo> {
    tokio::time::timeout(SLACK * 2, stream.next())
        .await
        .expect("observe() yielded nothing")
        .expect("stream ended")
        .expect("observe error")
}

/// A cancelled campaign withdraws: the next candidate is elected as soon
/// as the leader resigns.
pub async fn election_cancelled_campaign_withdraws<F: Fixture>(fx: &F) {
    let name = unique_name("elect_cancel");
    let c = clients(fx, 3).await;
    let e = |i: usize| {
        c[i].with_lease(lease(fx, c[i].as_ref(), long()))
            .expect("lease")
            .election(&name)
            .expect("election")
    };
    let leader = e(0).campaign("leader").await.expect("campaign");
    let quitter = e(1);
    for cut in [1, 5, 50, 300] {
        let r = tokio::time::timeout(Duration::from_millis(cut), quitter.campaign("quitter")).await;
        assert!(r.is_err(), "elected while another leads");
    }
    leader.resign().await.expect("resign");
    let next = tokio::time::timeout(SLACK, e(2).campaign("next"))
        .await
        .expect("a withdrawn candidate held the election")
        .expect("campaign");
    assert_eq!(
        e(0).leader().await.expect("leader").map(|l| l.id),
        Some("next".to_owned())
    );
    next.resign().await.expect("resign");
}

/// A leader whose lease runs out (manual renewal, never extended) loses
/// leadership: `lost()` fires, `leader()` and observers see it go, and the
/// next candidate wins with a higher term.
pub async fn election_expiry<F: Fixture>(fx: &F) {
    let name = unique_name("elect_expiry");
    let c = clients(fx, 2).await;
    let ttl = Duration::from_millis(500);
    let short = c[0]
        .with_lease(LeaseOptions::manual(ttl).expect("ttl"))
        .expect("lease")
        .election(&name)
        .expect("election");
    let other = c[1]
        .with_lease(long())
        .expect("lease")
        .election(&name)
        .expect("election");
    let old = short.campaign("short").await.expect("campaign");
    let waiting = tokio::spawn({
        let other = Arc::clone(&other);
        async move { other.campaign("next").await }
    });
    tokio::time::timeout(ttl + SLACK, old.lost())
        .await
        .expect("lost() did not fire when the leadership lease ran out");
    let next = tokio::time::timeout(SLACK * 2, waiting)
        .await
        .expect("no new leader after the old lease ran out")
        .expect("task")
        .expect("campaign");
    assert!(next.term() > old.term());
    let seen = other.leader().await.expect("leader").expect("a leader");
    assert_eq!((seen.id.as_str(), seen.term), ("next", next.term()));
    next.resign().await.expect("resign");
}
