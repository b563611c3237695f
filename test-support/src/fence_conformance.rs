//! The fence conformance suite: the rule of `distlock_core::fence`,
//! written once, run against every fence (in-process, Redis, ...).
//!
//! A fence implements [`FenceFixture`] (a client of the store, driven
//! through [`FencedStore`]: set a value under a token, read it, read the
//! numbers) and instantiates the suite with
//! [`fence_conformance_suite!`](crate::fence_conformance_suite), which writes
//! one `#[tokio::test]` per check.

// The suite fails loudly: an unexpected error is a panic with it.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use distlock_core::fence::{FenceToken, Highest, MAX_RESOURCE_LEN};
use distlock_core::{Error, Result};
use futures::future::BoxFuture;

use crate::unique_name;

/// One client of a fenced store, as the suite drives it: every write sets
/// the resource's value (a `u64`) through the store's fenced write.
pub trait FencedStore: Send + Sync {
    /// Sets `resource` to `value` if `token` is admitted, atomically.
    fn write<'a>(
        &'a self,
        resource: &'a str,
        token: FenceToken,
        value: u64,
    ) -> BoxFuture<'a, Result<()>>;

    /// Admits `token` on `resource` and reads its value, in one atomic
    /// step (a fenced read: from then on every lower token is refused).
    fn admit_read<'a>(
        &'a self,
        resource: &'a str,
        token: FenceToken,
    ) -> BoxFuture<'a, Result<Option<u64>>>;

    /// The value of `resource` (`None`: never written).
    fn read<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<u64>>>;

    /// What `resource` has admitted.
    fn highest<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Highest>>;
}

/// The fence under test.
pub trait FenceFixture: Send + Sync + 'static {
    /// A new client of the store (its own connection where the store has
    /// them); every client of one fixture sees the same resources.
    fn store(&self) -> BoxFuture<'_, Arc<dyn FencedStore>>;
}

fn x(t: u64) -> FenceToken {
    FenceToken::exclusive(t)
}

fn s(t: u64) -> FenceToken {
    FenceToken::shared(t)
}

#[track_caller]
fn assert_stale(r: Result<()>, token: u64, highest: u64) {
    match r {
        Err(Error::Stale {
            token: t,
            highest: h,
        }) if t == token && h == highest => {}
        other => panic!("expected Stale {{ token: {token}, highest: {highest} }}, got {other:?}"),
    }
}

/// A higher token is admitted and its write lands; the numbers follow.
pub async fn admits_higher<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("admits_higher");
    assert_eq!(store.highest(&r).await.unwrap(), Highest::default());
    assert_eq!(store.read(&r).await.unwrap(), None);
    store.write(&r, x(1), 10).await.unwrap();
    store.write(&r, x(5), 50).await.unwrap();
    assert_eq!(store.read(&r).await.unwrap(), Some(50));
    assert_eq!(
        store.highest(&r).await.unwrap(),
        Highest {
            token: 5,
            exclusive: 5
        }
    );
}

/// The same token again (the same holder's next write) is admitted.
pub async fn admits_equal<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("admits_equal");
    store.write(&r, x(7), 1).await.unwrap();
    store.write(&r, x(7), 2).await.unwrap();
    assert_eq!(store.read(&r).await.unwrap(), Some(2));
    assert_eq!(store.highest(&r).await.unwrap().token, 7);
}

/// A lower token is refused with `Stale { token, highest }`, and the
/// refusal changes neither the value nor the numbers.
pub async fn refuses_lower_and_changes_nothing<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("refuses_lower");
    store.write(&r, x(5), 50).await.unwrap();
    let before = store.highest(&r).await.unwrap();
    assert_stale(store.write(&r, x(3), 30).await, 3, 5);
    assert_stale(store.write(&r, x(4), 40).await, 4, 5);
    assert_eq!(store.read(&r).await.unwrap(), Some(50));
    assert_eq!(store.highest(&r).await.unwrap(), before);
    // A refused first write leaves a resource that was never written as it
    // was.
    let fresh = unique_name("refuses_lower_fresh");
    store.write(&fresh, x(9), 1).await.unwrap();
    let other = unique_name("refuses_lower_other");
    assert_eq!(store.highest(&other).await.unwrap(), Highest::default());
    assert_eq!(store.read(&other).await.unwrap(), None);
}

/// Shared tokens are fenced against exclusive ones only: interleaved
/// readers are admitted in any order, a writer below a reader is refused,
/// a reader below a writer that wrote is refused.
pub async fn shared_tokens<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("shared_tokens");
    store.write(&r, x(3), 3).await.unwrap();
    store.write(&r, s(6), 6).await.unwrap();
    store.write(&r, s(5), 5).await.unwrap();
    store.write(&r, s(6), 6).await.unwrap();
    assert_eq!(
        store.highest(&r).await.unwrap(),
        Highest {
            token: 6,
            exclusive: 3
        }
    );
    assert_stale(store.write(&r, s(2), 2).await, 2, 3);
    assert_stale(store.write(&r, x(5), 5).await, 5, 6);
    store.write(&r, x(8), 8).await.unwrap();
    assert_stale(store.write(&r, s(7), 7).await, 7, 8);
    assert_eq!(store.read(&r).await.unwrap(), Some(8));
    assert_eq!(
        store.highest(&r).await.unwrap(),
        Highest {
            token: 8,
            exclusive: 8
        }
    );
}

/// A fenced read admits its token: a lower write is refused after it, and
/// a lower fenced read too.
pub async fn a_fenced_read_admits<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("fenced_read");
    assert_eq!(store.admit_read(&r, x(2)).await.unwrap(), None);
    store.write(&r, x(2), 20).await.unwrap();
    assert_eq!(store.admit_read(&r, x(4)).await.unwrap(), Some(20));
    assert_stale(store.write(&r, x(3), 30).await, 3, 4);
    assert_stale(store.admit_read(&r, x(3)).await.map(drop), 3, 4);
    assert_eq!(store.admit_read(&r, s(5)).await.unwrap(), Some(20));
    assert_eq!(store.read(&r).await.unwrap(), Some(20));
    assert_eq!(
        store.highest(&r).await.unwrap(),
        Highest {
            token: 5,
            exclusive: 4
        }
    );
}

/// Resources are fenced apart: a high token on one does not refuse a low
/// one on another.
pub async fn resources_are_independent<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let a = unique_name("independent_a");
    let b = unique_name("independent_b");
    store.write(&a, x(100), 1).await.unwrap();
    store.write(&b, x(1), 2).await.unwrap();
    assert_eq!(store.highest(&b).await.unwrap().token, 1);
    assert_eq!(store.read(&a).await.unwrap(), Some(1));
}

/// Many tasks on several clients write at once with random tokens (each
/// writes its token as the value): a lower token is never admitted after a
/// higher one. Checked three ways: every refusal names a higher token; an
/// observer never sees the numbers go down; and at the end the value is
/// the highest token admitted (a lower one admitted after it would have
/// overwritten it).
pub async fn concurrent_admits_never_go_down<F: FenceFixture>(fx: &F) {
    let r = Arc::new(unique_name("concurrent"));
    let max_admitted = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(fx.store().await);
    }
    let mut tasks = Vec::new();
    for task in 0..16u64 {
        // Four tasks per client, as a process's tasks share one.
        let store = Arc::clone(&clients[usize::try_from(task % 4).unwrap_or(0)]);
        let (r, max_admitted) = (Arc::clone(&r), Arc::clone(&max_admitted));
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(task);
            let mut admitted = 0;
            for _ in 0..25 {
                let t = rng.u64(1..=200);
                match store.write(&r, x(t), t).await {
                    Ok(()) => {
                        admitted += 1;
                        max_admitted.fetch_max(t, Ordering::SeqCst);
                        let h = store.highest(&r).await.unwrap();
                        assert!(h.token >= t, "admitted {t}, then highest {h:?}");
                    }
                    Err(Error::Stale { token, highest }) => {
                        assert_eq!(token, t);
                        assert!(highest > t, "refused {t} for {highest}");
                    }
                    Err(e) => panic!("write {t}: {e:?}"),
                }
            }
            admitted
        }));
    }
    let observer = {
        let (store, r) = (fx.store().await, Arc::clone(&r));
        tokio::spawn(async move {
            let mut last = 0;
            for _ in 0..100 {
                let h = store.highest(&r).await.unwrap();
                assert!(h.token >= last, "highest went down: {last} then {h:?}");
                last = h.token;
                tokio::task::yield_now().await;
            }
        })
    };
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("writer panicked");
    }
    observer.await.expect("observer panicked");
    assert!(admitted > 0);
    let store = fx.store().await;
    let max = max_admitted.load(Ordering::SeqCst);
    assert_eq!(store.read(&r).await.unwrap(), Some(max));
    assert_eq!(store.highest(&r).await.unwrap().token, max);
}

/// Bad input is a typed error, never a panic: token 0, an empty resource
/// name, one over the longest; nothing is written.
pub async fn bad_input<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("bad_input");
    let e = store.write(&r, x(0), 1).await.unwrap_err();
    assert!(e.is_invalid_input(), "token 0: {e:?}");
    let e = store.write(&r, s(0), 1).await.unwrap_err();
    assert!(e.is_invalid_input(), "shared token 0: {e:?}");
    assert_eq!(store.read(&r).await.unwrap(), None);
    assert_eq!(store.highest(&r).await.unwrap(), Highest::default());
    let e = store.write("", x(1), 1).await.unwrap_err();
    assert!(e.is_invalid_input(), "empty resource: {e:?}");
    let e = store.highest("").await.unwrap_err();
    assert!(e.is_invalid_input(), "empty resource: {e:?}");
    let long = "r".repeat(MAX_RESOURCE_LEN + 1);
    let e = store.write(&long, x(1), 1).await.unwrap_err();
    assert!(e.is_invalid_input(), "long resource: {e:?}");
    let e = store.write(&r, x(u64::MAX), 1).await;
    // The largest token is a token like any other.
    e.unwrap();
    assert_eq!(store.highest(&r).await.unwrap().token, u64::MAX);
    assert_stale(
        store.write(&r, x(u64::MAX - 1), 2).await,
        u64::MAX - 1,
        u64::MAX,
    );
}

/// The resource names of distlock's own Redis keys: the shapes
/// `distlock_core::fence::check_resource` reserves, on resource `r`.
fn reserved_shapes(r: &str) -> Vec<String> {
    let mut out = vec![
        // Fences: `r`'s own, and one of a key with a hash tag.
        format!("{{{r}}}:distlock:highest"),
        format!("{{{r}}}:distlock:highest:{{{r}}}x"),
        format!("{{{r}}}:distlock"),
    ];
    // A lock's internals, with the lock key `r` (`PREFIX NAME`).
    for suffix in [
        "fence",
        "released",
        "fair:queue",
        "fair:timeouts",
        "fair:owners",
        "holder",
        "revoke",
        "waiting",
        "waiting:alive",
        "handoff",
        "listening",
        "elect",
        "elect:fence",
        "elect:leader",
        "rw:writer",
        "rw:fence",
        "sem:permits",
        "sem:fence",
        "ids",
        "redlock:fence",
    ] {
        out.push(format!("{{{r}}}:{suffix}"));
    }
    // A lock key with a prefix of its own braces: `{app}:r`.
    out.push(format!("{{{{app}}:{r}}}:fence"));
    out
}

/// One resource rule for every fence, checked before anything is sent:
/// a name with a control character (NUL included), a `}` without a hash
/// tag, or the shape of one of distlock's own keys (another resource's
/// fence, a lock's fencing counter, ...) is refused with
/// `Error::InvalidName` by every write, fenced read and read of the
/// numbers, whatever the token; such a write never changes another
/// resource's fence (the reviewer's case: a write on `{r}:distlock:highest`
/// must not lower or remove `r`'s highest). Names that only look alike are
/// ordinary, independent resources.
pub async fn reserved_and_control_resources<F: FenceFixture>(fx: &F) {
    let store = fx.store().await;
    let r = unique_name("reserved");
    store.write(&r, x(100), 100).await.unwrap();
    let before = store.highest(&r).await.unwrap();
    let mut bad = reserved_shapes(&r);
    for c in ['\0', '\n', '\t', '\r', '\u{1b}', '\u{7f}', '\u{85}'] {
        bad.push(format!("{r}{c}"));
        bad.push(format!("{c}{r}"));
    }
    bad.push(format!("{r}}}x"));
    bad.push(format!("{{}}{r}}}"));
    for b in &bad {
        for t in [x(5), x(200), s(5), s(200)] {
            match store.write(b, t, 5).await {
                Err(Error::InvalidName { .. }) => {}
                other => panic!("write {b:?} with {t:?}: {other:?}"),
            }
            match store.admit_read(b, t).await {
                Err(Error::InvalidName { .. }) => {}
                other => panic!("fenced read {b:?} with {t:?}: {other:?}"),
            }
        }
        match store.highest(b).await {
            Err(Error::InvalidName { .. }) => {}
            other => panic!("highest {b:?}: {other:?}"),
        }
    }
    assert_eq!(store.highest(&r).await.unwrap(), before);
    assert_eq!(store.read(&r).await.unwrap(), Some(100));
    assert_stale(store.write(&r, x(5), 5).await, 5, 100);
    assert_stale(store.write(&r, s(99), 5).await, 99, 100);
    assert_eq!(store.read(&r).await.unwrap(), Some(100));

    // Near misses: not distlock's shapes, so ordinary resources, fenced
    // apart from `r`.
    for (i, ok) in [
        format!("{{{r}}}:profile"),
        format!("{{{r}}}:fences"),
        format!("{{{r}}}:FENCE"),
        format!("{{{r}}}fence"),
        format!("{r}:fence"),
        format!("x{{{r}}}:fence"),
        format!("{r}:distlock:highest"),
        format!("{r} caf\u{e9} \u{2028}"),
    ]
    .iter()
    .enumerate()
    {
        let v = u64::try_from(i).unwrap() + 1;
        store.write(ok, x(1), v).await.unwrap();
        assert_eq!(store.read(ok).await.unwrap(), Some(v), "{ok:?}");
        assert_eq!(store.highest(ok).await.unwrap().token, 1, "{ok:?}");
    }
    assert_eq!(store.highest(&r).await.unwrap(), before);
}

/// Writes one `#[tokio::test]` per check of the fence conformance suite
/// for the [`FenceFixture`] built by the expression.
#[macro_export]
macro_rules! fence_conformance_suite {
    ($fixture:expr) => {
        $crate::fence_conformance_suite!(@tests $fixture;
            admits_higher, admits_equal, refuses_lower_and_changes_nothing,
            shared_tokens, a_fenced_read_admits, resources_are_independent,
            concurrent_admits_never_go_down, bad_input,
            reserved_and_control_resources);
    };
    (@tests $fixture:expr; $($check:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = $fixture;
                $crate::fence_conformance::$check(&fixture).await;
            }
        )+
    };
}

/// The in-process fence as a [`FenceFixture`]: every client is the same
/// [`MemFence`](distlock_core::MemFence).
#[derive(Clone, Default)]
pub struct MemFenceFixture(Arc<distlock_core::MemFence<u64>>);

impl FencedStore for distlock_core::MemFence<u64> {
    fn write<'a>(
        &'a self,
        resource: &'a str,
        token: FenceToken,
        value: u64,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            distlock_core::MemFence::write(self, resource, token, |v| *v = Some(value))
        })
    }

    fn admit_read<'a>(
        &'a self,
        resource: &'a str,
        token: FenceToken,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move { distlock_core::MemFence::write(self, resource, token, |v| *v) })
    }

    fn read<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move { Ok(distlock_core::MemFence::read(self, resource)) })
    }

    fn highest<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Highest>> {
        Box::pin(async move { distlock_core::MemFence::highest(self, resource) })
    }
}

impl FenceFixture for MemFenceFixture {
    fn store(&self) -> BoxFuture<'_, Arc<dyn FencedStore>> {
        Box::pin(async move { Arc::clone(&self.0) as Arc<dyn FencedStore> })
    }
}
