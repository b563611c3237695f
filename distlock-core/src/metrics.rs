//! Metrics through the [`metrics`](https://docs.rs/metrics) crate facade
//! (cargo feature `metrics`, off by default): attach any exporter
//! (Prometheus, OpenTelemetry, StatsD) in the application; distlock only
//! records. Without the feature every call here compiles to nothing.
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `distlock_acquire_total` | counter | `try_lock` / `lock` / `lock_timeout` calls, by `outcome`: `acquired`, `busy` (`try_lock` found it held), `timeout` (`lock_timeout` ran out), `error` |
//! | `distlock_acquire_contended_total` | counter | acquisitions by `lock` / `lock_timeout` that waited (took more than 1 ms) |
//! | `distlock_wait_seconds` | histogram | how long each acquire call took, whatever its outcome |
//! | `distlock_waiters` | gauge | acquire calls of this process waiting now |
//! | `distlock_holds` | gauge | guards of this process holding now |
//! | `distlock_hold_seconds` | histogram | from acquisition to the guard's end (release, drop or loss) |
//! | `distlock_renewals_total` | counter | confirmed renewals (watchdog and `extend()`) |
//! | `distlock_renewal_failures_total` | counter | renewals that failed for a transport reason (the guard turns `Suspended`) |
//! | `distlock_leases_lost_total` | counter | guards that ended lost, by `reason` (`expired`, `taken`, `deleted`, `max_hold`, `session_expired`, `session_closed`, `provider_closed`) |
//!
//! Every metric carries `backend` (`mem`, `redis`, `zookeeper`, ...) and
//! `primitive` (`mutex`, `fair`, `rw`, `semaphore`, `election`). Lock names
//! are a label (`name`) only after [`set_name_labels`]`(true)`: names can be
//! many (cardinality). Elections count their leaderships as holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::guard::LostReason;
use crate::inspect::PrimitiveKind;
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
    pub(crate) fn hold_started(_: &Labels) {}
    #[inline]
    pub(crate) fn hold_ended(_: &Labels, _: Duration, _: Option<LostReason>) {}
    #[inline]
    pub(crate) fn renewal(_: &Labels, _: bool) {}
}

pub(crate) use imp::{acquire_ended, hold_ended, hold_started, renewal};

/// Counts a waiting acquire call while it lives.
pub(crate) struct Waiting<'a>(&'a Labels);

impl<'a> Waiting<'a> {
    pub(crate) fn new(labels: &'a Labels) -> Self {
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
pub(crate) struct Cell(std::sync::Arc<std::sync::OnceLock<Labels>>);

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
        self.0.get()
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
        self.0.set(labels).is_ok()
    }

    /// Does nothing without the feature.
    #[cfg(not(feature = "metrics"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn set(&self, _: Labels) -> bool {
        false
    }
}

/// An acquisition that took longer than this waited for the lock.
pub(crate) const CONTENDED: Duration = Duration::from_millis(1);
