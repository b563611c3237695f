//! Metrics through the [`metrics`](https://docs.rs/metrics) crate facade
//! (cargo feature `metrics`, off by default): attach any exporter
//! (Prometheus, OpenTelemetry, StatsD) in the application; distlock only
//! records. Without the feature every call here compiles to nothing.
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `distlock_acquire_total` | counter | `try_lock` / `lock` / `lock_timeout` calls, by `outcome`: `acquired`, `busy` (`try_lock` found it held), `timeout` (`lock_timeout` ran out), `error` |
//! | `distlock_acquire_contended_total` | counter | acquisitions by `lock` / `lock_timeout` / `campaign` that waited: were woken by a release, or (not a campaign) took more than 1 ms |
//! | `distlock_wait_seconds` | histogram | how long each acquire call took, whatever its outcome |
//! | `distlock_waiters` | gauge | acquire calls of this process waiting now |
//! | `distlock_holds` | gauge | guards of this process holding now |
//! | `distlock_suspended` | gauge | guards of this process whose renewals are failing now (`LeaseStatus::Suspended`), until a renewal succeeds, the lease is found lost, or the guard ends |
//! | `distlock_release_requested` | gauge | guards of this process whose holder was asked to release ([`Provider::request_release`](crate::Provider::request_release)) and still holds: until the lease is found lost or the guard ends |
//! | `distlock_release_requests_total` | counter | requests to release heard by guards of this process (once per guard) |
//! | `distlock_hold_seconds` | histogram | from acquisition to the guard's end (release, drop or loss) |
//! | `distlock_handoff_seconds` | histogram | for an acquisition that a wake-up ended (a release message on Redis, a watch event on ZooKeeper, a release in the process on `mem`): from that wake-up to the acquisition |
//! | `distlock_renewals_total` | counter | confirmed renewals (watchdog and `extend()`) |
//! | `distlock_renewal_failures_total` | counter | renewals that failed for a transport reason (the guard turns `Suspended`) |
//! | `distlock_leases_lost_total` | counter | guards that ended lost, by `reason` (`expired`, `taken`, `deleted`, `max_hold`, `session_expired`, `session_closed`, `provider_closed`) |
//!
//! Every metric carries `backend` (`mem`, `redis`, `zookeeper`, ...) and
//! `primitive` (`mutex`, `fair`, `rw`, `semaphore`, `election`). Lock names
//! are a label (`name`) only after [`set_name_labels`]`(true)`: names can be
//! many (cardinality). An election's campaign counts as an acquire call
//! (`outcome` `acquired` or `error`) and its leadership as a hold.
//!
//! The handoff histogram measures the part of a handoff this process sees:
//! from the moment the waiter learned the lock came free to the moment it
//! held it (one round trip on Redis when it wins the race, more when another
//! process got there first). The delivery of the wake-up itself (release to
//! message) happens on another machine's clock and is not in it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::inspect::PrimitiveKind;
use crate::lease::status::LostReason;
use crate::name::Name;

static NAME_LABELS: AtomicBool = AtomicBool::new(false);

/// Adds the lock name as a `name` label to every metric recorded from now
/// on (off by default: one series per name).
pub fn set_name_labels(on: bool) {
    NAME_LABELS.store(on, Ordering::Relaxed);
}

/// What a metric is about.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Labels {
    pub(crate) backend: &'static str,
    pub(crate) primitive: PrimitiveKind,
    pub(crate) name: Name,
}

/// How an acquire call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    Busy,
    Timeout,
    Error,
}

#[cfg(feature = "metrics")]
mod imp {
    use super::{Labels, LostReason, Outcome, NAME_LABELS};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn labels(l: &Labels, extra: Option<(&'static str, &'static str)>) -> Vec<metrics::Label> {
        let mut out = vec![
            metrics::Label::new("backend", l.backend),
            metrics::Label::new("primitive", l.primitive.as_str()),
        ];
        if NAME_LABELS.load(Ordering::Relaxed) {
            out.push(metrics::Label::new("name", l.name.to_string()));
        }
        if let Some((k, v)) = extra {
            out.push(metrics::Label::new(k, v));
        }
        out
    }

    pub(crate) fn waiting(l: &Labels, delta: f64) {
        metrics::gauge!("distlock_waiters", labels(l, None)).increment(delta);
    }

    pub(crate) fn acquire_ended(l: &Labels, outcome: Outcome, took: Duration, waited: bool) {
        let outcome = match outcome {
            Outcome::Acquired => "acquired",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        };
        metrics::counter!(
            "distlock_acquire_total",
            labels(l, Some(("outcome", outcome)))
        )
        .increment(1);
        metrics::histogram!("distlock_wait_seconds", labels(l, None)).record(took.as_secs_f64());
        if waited {
            metrics::counter!("distlock_acquire_contended_total", labels(l, None)).increment(1);
        }
    }

    pub(crate) fn suspended(l: &Labels, delta: f64) {
        metrics::gauge!("distlock_suspended", labels(l, None)).increment(delta);
    }

    pub(crate) fn release_requested(l: &Labels, on: bool) {
        metrics::gauge!("distlock_release_requested", labels(l, None)).increment(if on {
            1.0
        } else {
            -1.0
        });
        if on {
            metrics::counter!("distlock_release_requests_total", labels(l, None)).increment(1);
        }
    }

    pub(crate) fn handoff(l: &Labels, took: Duration) {
        metrics::histogram!("distlock_handoff_seconds", labels(l, None)).record(took.as_secs_f64());
    }

    pub(crate) fn hold_started(l: &Labels) {
        metrics::gauge!("distlock_holds", labels(l, None)).increment(1.0);
    }

    pub(crate) fn hold_ended(l: &Labels, held: Duration, lost: Option<LostReason>) {
        metrics::gauge!("distlock_holds", labels(l, None)).decrement(1.0);
        metrics::histogram!("distlock_hold_seconds", labels(l, None)).record(held.as_secs_f64());
        if let Some(reason) = lost {
            let reason = match reason {
                LostReason::Expired => "expired",
                LostReason::Taken => "taken",
                LostReason::SessionExpired => "session_expired",
                LostReason::SessionClosed => "session_closed",
                LostReason::Deleted => "deleted",
                LostReason::MaxHold => "max_hold",
                LostReason::ProviderClosed => "provider_closed",
            };
            metrics::counter!(
                "distlock_leases_lost_total",
                labels(l, Some(("reason", reason)))
            )
            .increment(1);
        }
    }

    pub(crate) fn renewal(l: &Labels, ok: bool) {
        if ok {
            metrics::counter!("distlock_renewals_total", labels(l, None)).increment(1);
        } else {
            metrics::counter!("distlock_renewal_failures_total", labels(l, None)).increment(1);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::{Labels, LostReason, Outcome};
    use std::time::Duration;

    #[inline]
    pub(crate) fn waiting(_: &Labels, _: f64) {}
    #[inline]
    pub(crate) fn acquire_ended(_: &Labels, _: Outcome, _: Duration, _: bool) {}
    #[inline]
    pub(crate) fn handoff(_: &Labels, _: Duration) {}
    #[inline]
    pub(crate) fn hold_started(_: &Labels) {}
    #[inline]
    pub(crate) fn hold_ended(_: &Labels, _: Duration, _: Option<LostReason>) {}
    #[inline]
    pub(crate) fn renewal(_: &Labels, _: bool) {}
}

pub(crate) use imp::{acquire_ended, handoff, hold_ended, hold_started, renewal};

#[cfg(feature = "metrics")]
tokio::task_local! {
    /// When the acquire call running in this task was last woken.
    static WOKEN: std::cell::Cell<Option<std::time::Instant>>;
}

/// See [`crate::backend::woke`].
#[inline]
pub(crate) fn note_wakeup() {
    #[cfg(feature = "metrics")]
    let _ = WOKEN.try_with(|at| at.set(Some(std::time::Instant::now())));
}

/// Runs `acquire`, returning its output and the last wake-up it noted
/// (see [`crate::backend::woke`]); never a wake-up without the feature.
async fn watching_wakeups<T>(
    acquire: impl std::future::Future<Output = T>,
) -> (T, Option<std::time::Instant>) {
    #[cfg(feature = "metrics")]
    return WOKEN
        .scope(std::cell::Cell::new(None), async {
            let out = acquire.await;
            (out, WOKEN.with(std::cell::Cell::get))
        })
        .await;
    #[cfg(not(feature = "metrics"))]
    (acquire.await, None)
}

/// What an acquire call hands back, as the metrics see it: the guard of a
/// lock (or none), the leadership of a campaign.
pub(crate) trait Acquisition {
    /// Whether the call acquired (`false`: busy, or the wait ran out).
    fn acquired(&self) -> bool;
    /// Gives the hold its labels (once) and counts it as a hold.
    fn count_hold(&self, labels: Labels);
}

/// Records one acquire call that ended as `result` after `took` (its last
/// wake-up at `woken`; `waits`: it was not a `try_lock`); attaches the
/// labels to the hold it returned.
fn acquire_call_ended<A: Acquisition>(
    labels: Labels,
    waits: bool,
    result: Result<&A, ()>,
    took: Duration,
    woken: Option<std::time::Instant>,
    campaign: bool,
) {
    let outcome = match result {
        Ok(held) if held.acquired() => Outcome::Acquired,
        Ok(_) if !waits => Outcome::Busy,
        Ok(_) => Outcome::Timeout,
        Err(()) => Outcome::Error,
    };
    // Waited: woken by a release, or (a lock, not a campaign, whose first
    // steps take longer) took longer than a free lock takes.
    let contended = outcome == Outcome::Acquired
        && waits
        && (woken.is_some() || (!campaign && took > CONTENDED));
    acquire_ended(&labels, outcome, took, contended);
    if let Ok(held) = result {
        if outcome == Outcome::Acquired {
            if let Some(at) = woken {
                handoff(&labels, at.elapsed());
            }
            held.count_hold(labels);
        }
    }
}

/// Counts a waiting acquire call while it lives.
struct Waiting<'a>(&'a Labels);

impl<'a> Waiting<'a> {
    fn new(labels: &'a Labels) -> Self {
        imp::waiting(labels, 1.0);
        Waiting(labels)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        imp::waiting(self.0, -1.0);
    }
}

/// A guard's metric labels, set once by the acquire call that made it and
/// shared with its watchdog; nothing at all without the feature.
#[cfg(feature = "metrics")]
#[derive(Clone, Debug, Default)]
pub(crate) struct Cell(std::sync::Arc<CellInner>);

#[cfg(feature = "metrics")]
#[derive(Debug, Default)]
pub(crate) struct CellInner {
    labels: std::sync::OnceLock<Labels>,
    /// Counted in `distlock_suspended` now.
    suspended: AtomicBool,
    /// The lease was found lost: it is suspended no more, whatever a
    /// renewal that failed meanwhile says.
    ended: AtomicBool,
    /// Asked to release: counted in `distlock_release_requested` now
    /// (`Some(true)`), or once asked and no longer (`Some(false)`).
    asked: std::sync::Mutex<Option<bool>>,
}

/// A guard's metric labels: nothing without the feature.
#[cfg(not(feature = "metrics"))]
#[derive(Clone, Debug)]
pub(crate) struct Cell;

impl Cell {
    /// No labels yet.
    pub(crate) fn new() -> Self {
        #[cfg(feature = "metrics")]
        return Cell(std::sync::Arc::default());
        #[cfg(not(feature = "metrics"))]
        Cell
    }

    /// The labels, once set.
    #[cfg(feature = "metrics")]
    pub(crate) fn get(&self) -> Option<&Labels> {
        self.0.labels.get()
    }

    /// The labels, once set: never without the feature.
    #[cfg(not(feature = "metrics"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn get(&self) -> Option<&Labels> {
        None
    }

    /// Sets the labels; `false` if they were set already.
    #[cfg(feature = "metrics")]
    pub(crate) fn set(&self, labels: Labels) -> bool {
        // Under the request's lock: a request heard meanwhile is counted
        // once, here or by `release_requested`.
        let asked = self
            .0
            .asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let set = self.0.labels.set(labels).is_ok();
        if set && *asked == Some(true) {
            if let Some(labels) = self.get() {
                imp::release_requested(labels, true);
            }
        }
        set
    }

    /// Counts the hold in the `distlock_suspended` gauge while `on`
    /// (its renewals are failing), once labelled.
    #[cfg(feature = "metrics")]
    pub(crate) fn suspended(&self, on: bool) {
        if let Some(labels) = self.get() {
            if on && self.0.ended.load(Ordering::SeqCst) {
                return;
            }
            if self.0.suspended.swap(on, Ordering::SeqCst) != on {
                imp::suspended(labels, if on { 1.0 } else { -1.0 });
            }
            // Found lost meanwhile: its hook's reset may have come first.
            if on
                && self.0.ended.load(Ordering::SeqCst)
                && self.0.suspended.swap(false, Ordering::SeqCst)
            {
                imp::suspended(labels, -1.0);
            }
        }
    }

    /// The lease was found lost: no longer counted as suspended or asked
    /// (though its guard may live on), whatever comes after.
    #[cfg(feature = "metrics")]
    pub(crate) fn ended(&self) {
        self.0.ended.store(true, Ordering::SeqCst);
        self.suspended(false);
        self.release_requested(false);
    }

    /// Does nothing without the feature.
    #[cfg(not(feature = "metrics"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn ended(&self) {}

    /// Does nothing without the feature.
    #[cfg(not(feature = "metrics"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn suspended(&self, _: bool) {}

    /// Counts the hold in the `distlock_release_requested` gauge from the
    /// request (`true`) until the guard ends (`false`), and the request
    /// once in `distlock_release_requests_total`; a request heard before
    /// the labels are set is counted when they are.
    #[cfg(feature = "metrics")]
    pub(crate) fn release_requested(&self, on: bool) {
        let mut asked = self
            .0
            .asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (*asked, on) {
            // Heard as the lease ended: not counted.
            (None, true) if self.0.ended.load(Ordering::SeqCst) => {}
            (None, true) => {
                *asked = Some(true);
                if let Some(labels) = self.get() {
                    imp::release_requested(labels, true);
                }
            }
            (Some(true), false) => {
                *asked = Some(false);
                if let Some(labels) = self.get() {
                    imp::release_requested(labels, false);
                }
            }
            _ => {}
        }
    }

    /// Does nothing without the feature.
    #[cfg(not(feature = "metrics"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn release_requested(&self, _: bool) {}

    /// Does nothing without the feature.
    #[cfg(not(feature = "metrics"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn set(&self, _: Labels) -> bool {
        false
    }
}

/// An acquisition that took longer than this waited for the lock.
pub(crate) const CONTENDED: Duration = Duration::from_millis(1);

/// Runs one acquire call and records it: counted as waiting while it runs
/// (`waits`: it is not a `try_lock`), how it ended, how long it took, and
/// the hold it returned. `campaign`: an election's campaign, whose first
/// steps take longer than a free lock's (see [`CONTENDED`]).
pub(crate) async fn measured<A: Acquisition>(
    labels: Labels,
    waits: bool,
    campaign: bool,
    call: impl std::future::Future<Output = crate::error::Result<A>>,
) -> crate::error::Result<A> {
    let started = tokio::time::Instant::now();
    let waiting = waits.then(|| Waiting::new(&labels));
    let (result, woken) = watching_wakeups(call).await;
    drop(waiting);
    acquire_call_ended(
        labels,
        waits,
        result.as_ref().map_err(|_| ()),
        started.elapsed(),
        woken,
        campaign,
    );
    result
}
