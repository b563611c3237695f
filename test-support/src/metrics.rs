//! Reading back what distlock recorded through the `metrics` facade:
//! `metrics-util`'s debugging recorder, summed across its draining
//! snapshots, and the check every backend runs.
// Checks unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use distlock_core::{LeaseOptions, Provider};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;

/// The debugging recorder, installed globally on first use (one per test
/// binary: use it in a binary of its own).
pub fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

/// Everything recorded so far. The debugging recorder's snapshots drain
/// what they return (counters and gauges start again from 0, histograms
/// empty), so the snapshots are summed here: counters and gauges (only
/// ever moved by increments) add up, histogram samples pile up.
#[derive(Default)]
struct Seen {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    histograms: HashMap<String, usize>,
}

static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

fn series(key: &metrics::Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

fn wanted(metric: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    l.sort();
    format!("{metric}{{{}}}", l.join(","))
}

fn read<T>(f: impl FnOnce(&Seen) -> T) -> T {
    let mut seen = SEEN.lock().unwrap();
    let seen = seen.get_or_insert_with(Seen::default);
    for (key, _, _, value) in recorder().snapshot().into_vec() {
        let key: &CompositeKey = &key;
        let name = series(key.key());
        match value {
            DebugValue::Counter(n) => *seen.counters.entry(name).or_default() += n,
            DebugValue::Gauge(g) => *seen.gauges.entry(name).or_default() += g.into_inner(),
            DebugValue::Histogram(h) => *seen.histograms.entry(name).or_default() += h.len(),
        }
    }
    f(seen)
}

/// A counter's total so far.
pub fn counter(metric: &str, labels: &[(&str, &str)]) -> u64 {
    read(|s| {
        s.counters
            .get(&wanted(metric, labels))
            .copied()
            .unwrap_or(0)
    })
}

/// A gauge's value (the sum of its moves).
pub fn gauge(metric: &str, labels: &[(&str, &str)]) -> f64 {
    read(|s| {
        s.gauges
            .get(&wanted(metric, labels))
            .copied()
            .unwrap_or(0.0)
    })
}

/// How many samples a histogram got.
pub fn histogram_count(metric: &str, labels: &[(&str, &str)]) -> usize {
    read(|s| {
        s.histograms
            .get(&wanted(metric, labels))
            .copied()
            .unwrap_or(0)
    })
}

/// On `a` and `b` (two clients of `backend`) with name labels on: an
/// acquisition, a busy `try_lock`, a timed-out `lock_timeout`, a contended
/// `lock`, the holds and waiters gauges, the wait, hold and handoff
/// histograms, and an election's campaigns and leaderships match what was
/// done. Needs `metrics::set_name_labels(true)` isolation: run
/// it in a test binary of its own.
pub async fn acquisitions_are_recorded(
    a: &dyn Provider,
    b: &dyn Provider,
    backend: &str,
    lease: LeaseOptions,
) {
    recorder();
    distlock_core::metrics::set_name_labels(true);
    let name = crate::unique_name("metrics");
    let base = [
        ("backend", backend),
        ("primitive", "mutex"),
        ("name", name.as_str()),
    ];
    let with = |k: &'static str, v: &'static str| {
        let mut l = base.to_vec();
        l.push((k, v));
        l
    };
    let lock_a = a.with_lease(lease).unwrap().mutex(&name).unwrap();
    let lock_b = b.with_lease(lease).unwrap().mutex(&name).unwrap();
    let held = lock_a.try_lock().await.unwrap().unwrap();
    assert_eq!(gauge("distlock_holds", &base), 1.0);
    assert!(lock_b.try_lock().await.unwrap().is_none());
    assert!(lock_b
        .lock_timeout(Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());
    let waiter = tokio::spawn({
        let lock_b = std::sync::Arc::clone(&lock_b);
        async move { lock_b.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gauge("distlock_waiters", &base), 1.0);
    held.release().await.unwrap();
    let next = tokio::time::timeout(crate::conformance::SLACK, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        counter("distlock_acquire_total", &with("outcome", "acquired")),
        2
    );
    assert_eq!(
        counter("distlock_acquire_total", &with("outcome", "busy")),
        1
    );
    assert_eq!(
        counter("distlock_acquire_total", &with("outcome", "timeout")),
        1
    );
    assert_eq!(counter("distlock_acquire_contended_total", &base), 1);
    assert_eq!(gauge("distlock_waiters", &base), 0.0);
    assert_eq!(histogram_count("distlock_wait_seconds", &base), 4);
    // The waiter was woken by the release: one handoff.
    assert_eq!(histogram_count("distlock_handoff_seconds", &base), 1);
    next.release().await.unwrap();
    assert_eq!(gauge("distlock_holds", &base), 0.0);
    assert_eq!(histogram_count("distlock_hold_seconds", &base), 2);

    // An election: campaigns are acquire calls, leaderships are holds.
    let name = crate::unique_name("metrics-elect");
    let base = [
        ("backend", backend),
        ("primitive", "election"),
        ("name", name.as_str()),
    ];
    let acquired = {
        let mut l = base.to_vec();
        l.push(("outcome", "acquired"));
        l
    };
    let elect_a = a.with_lease(lease).unwrap().election(&name).unwrap();
    let elect_b = b.with_lease(lease).unwrap().election(&name).unwrap();
    let leader = elect_a.campaign("a").await.unwrap();
    assert_eq!(gauge("distlock_holds", &base), 1.0);
    let campaign = tokio::spawn(async move { elect_b.campaign("b").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gauge("distlock_waiters", &base), 1.0);
    leader.resign().await.unwrap();
    let next = tokio::time::timeout(crate::conformance::SLACK, campaign)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(counter("distlock_acquire_total", &acquired), 2);
    assert_eq!(counter("distlock_acquire_contended_total", &base), 1);
    assert_eq!(gauge("distlock_waiters", &base), 0.0);
    assert_eq!(histogram_count("distlock_handoff_seconds", &base), 1);
    next.resign().await.unwrap();
    assert_eq!(gauge("distlock_holds", &base), 0.0);
    assert_eq!(histogram_count("distlock_hold_seconds", &base), 2);
    distlock_core::metrics::set_name_labels(false);
}

/// On `provider` (whose lock key for a name is `key_of(name)` when
/// `secret_of` can read its value, e.g. a Redis token): the acquire and
/// release events carry the provider's owner identity and the fencing
/// token, and no event ever shows `secret_of`'s value. Installs
/// [`crate::tracing_capture`] for the test binary.
pub async fn tracing_events_carry_the_owner<S, F>(provider: &dyn Provider, secret_of: S)
where
    S: Fn(String) -> F,
    F: std::future::Future<Output = Option<String>>,
{
    crate::tracing_capture::install();
    let name = crate::unique_name("traced");
    let lock = provider.mutex(&name).unwrap();
    let guard = lock.try_lock().await.unwrap().unwrap();
    let token = guard.fencing_token();
    let secret = secret_of(name.clone()).await;
    guard.release().await.unwrap();
    let events = crate::tracing_capture::lines_with(&format!("name={name}"));
    let owner = format!("owner={}", provider.owner());
    for what in ["distlock lease acquired", "distlock lease released"] {
        assert!(
            events.iter().any(|e| e.contains(what)
                && e.contains(&owner)
                && e.contains(&format!("token={token}"))),
            "no {what:?} event with {owner} and token={token} among {events:#?}"
        );
    }
    if let Some(secret) = secret {
        assert!(
            secret.len() >= 8,
            "a lock value too short to search for: {secret:?}"
        );
        let shown = crate::tracing_capture::lines_with(&secret);
        assert!(shown.is_empty(), "events show the lock's value: {shown:#?}");
    }
}
