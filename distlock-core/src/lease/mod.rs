//! Lease options: how long a lease lasts and how it is kept alive.

// Also here, below the guard, and reaching backends through `backend`: how a
// lease stands (`status`) and its status cell (`signal`), what keeps a held
// lease (`terms`), the provider's register of its leases (`lifecycle`), the
// cleanup drop-guard (`cleanup`), and what a backend hands over for a new
// guard (`parts`).
pub(crate) mod cleanup;
pub(crate) mod lifecycle;
pub(crate) mod parts;
pub(crate) mod signal;
pub(crate) mod status;
pub(crate) mod terms;

use std::time::Duration;

use crate::error::{Error, Result};

/// How a lease is kept alive while its guard lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// A watchdog renews the lease every `interval` (by default TTL/3) until
    /// the guard is released or dropped, and fires `lost()` if it cannot.
    Watchdog {
        /// Time between renewals; shorter than the TTL.
        interval: Duration,
    },
    /// No watchdog: the lease lasts its TTL unless the holder calls
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    Manual,
}

/// Lease TTL and renewal mode of a lock or leadership.
///
/// Session-based backends (ZooKeeper) tie a lease to the client session
/// instead: they accept only their provider's default options (plus a
/// [`LeaseOptions::max_hold`]) and refuse any other with
/// [`Error::InvalidOptions`], never ignoring them silently.
///
/// ```
/// use std::time::Duration;
/// # use distlock_core as distlock;
/// use distlock::{LeaseOptions, Renewal};
///
/// let default = LeaseOptions::default();
/// assert_eq!(default.ttl(), Duration::from_secs(30));
/// assert_eq!(default.renewal(), Renewal::Watchdog { interval: Duration::from_secs(10) });
///
/// let manual = LeaseOptions::manual(Duration::from_secs(5))?;
/// assert_eq!(manual.renewal(), Renewal::Manual);
/// assert!(LeaseOptions::new(Duration::ZERO).is_err());
/// # Ok::<(), distlock::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    ttl: Duration,
    renewal: Renewal,
    max_hold: Option<Duration>,
}

impl LeaseOptions {
    /// The default TTL: 30 s, as Redisson's lock watchdog.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The shortest TTL accepted: 10 ms. Servers count leases in
    /// milliseconds, the holder gives up `TTL/100 + 2 ms` early (the drift
    /// margin), and a watchdog must get at least two renewals into what is
    /// left; below 10 ms no renewal can be in time.
    pub const MIN_TTL: Duration = Duration::from_millis(10);
    /// The longest TTL accepted: 30 days.
    pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

    /// A lease of `ttl` renewed by a watchdog every `ttl / 3`.
    ///
    /// The TTL is truncated to whole milliseconds.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `ttl` is below [`Self::MIN_TTL`] or
    /// above [`Self::MAX_TTL`].
    pub fn new(ttl: Duration) -> Result<Self> {
        let ttl = check_ttl(ttl)?;
        Ok(LeaseOptions {
            ttl,
            renewal: Renewal::Watchdog {
                interval: default_interval(ttl),
            },
            max_hold: None,
        })
    }

    /// A lease of `ttl` without watchdog: it ends after `ttl` unless
    /// extended by hand.
    ///
    /// # Errors
    ///
    /// As [`LeaseOptions::new`].
    pub fn manual(ttl: Duration) -> Result<Self> {
        Ok(LeaseOptions {
            ttl: check_ttl(ttl)?,
            renewal: Renewal::Manual,
            max_hold: None,
        })
    }

    /// The same TTL, renewed by a watchdog every `interval`.
    ///
    /// The interval may be at most half of what the holder can count on,
    /// `(TTL − drift) / 2` (see [`clock_drift`]), so that a renewal that fails
    /// once is retried before the lease runs out.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `interval` is zero or above
    /// `(TTL − drift) / 2`.
    pub fn with_watchdog_interval(self, interval: Duration) -> Result<Self> {
        let longest = max_interval(self.ttl);
        if interval.is_zero() || interval > longest {
            return Err(Error::InvalidOptions(format!(
                "watchdog interval {interval:?} must be above zero and at most (TTL - drift) / 2 = {longest:?} for the TTL {:?}",
                self.ttl
            )));
        }
        Ok(LeaseOptions {
            renewal: Renewal::Watchdog { interval },
            ..self
        })
    }

    /// The same lease, held at most `limit` from its acquisition: then
    /// `lost()` fires with [`LostReason::MaxHold`](crate::LostReason::MaxHold),
    /// renewals stop (`extend()` is refused), and in watchdog mode the lease
    /// is released at once (in manual mode it runs out with its TTL). A stuck
    /// holder cannot keep a lease forever. `is_held()` turns false at the
    /// limit by the clock, even if the runtime is starved. A `limit` longer
    /// than a manual lease's TTL never comes into play.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a zero limit or one above
    /// [`Self::MAX_TTL`] × 1000.
    pub fn max_hold(self, limit: Duration) -> Result<Self> {
        if limit.is_zero() || limit > Self::MAX_TTL.saturating_mul(1000) {
            return Err(Error::InvalidOptions(format!(
                "max_hold {limit:?} must be above zero and at most 30 000 days"
            )));
        }
        Ok(LeaseOptions {
            max_hold: Some(limit),
            ..self
        })
    }

    /// The longest hold allowed ([`LeaseOptions::max_hold`]), if any.
    #[must_use]
    pub fn hold_limit(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The lease's time to live.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The TTL in whole milliseconds, as servers take it.
    #[must_use]
    pub fn ttl_millis(&self) -> u64 {
        // MAX_TTL keeps this far below u64::MAX.
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// How the lease is renewed.
    #[must_use]
    pub fn renewal(&self) -> Renewal {
        self.renewal
    }
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            ttl: Self::DEFAULT_TTL,
            renewal: Renewal::Watchdog {
                interval: default_interval(Self::DEFAULT_TTL),
            },
            max_hold: None,
        }
    }
}

fn default_interval(ttl: Duration) -> Duration {
    (ttl / 3).min(max_interval(ttl))
}

/// The longest watchdog interval that leaves room for one retry:
/// `(TTL − drift) / 2`.
pub(crate) fn max_interval(ttl: Duration) -> Duration {
    ttl.saturating_sub(clock_drift(ttl)) / 2
}

/// What the holder can count on after a renewal for `ttl` sent at `sent`:
/// the server's expiry less the drift margin.
pub(crate) fn local_deadline(sent: tokio::time::Instant, ttl: Duration) -> tokio::time::Instant {
    let valid = ttl.saturating_sub(clock_drift(ttl));
    sent.checked_add(valid).unwrap_or(sent)
}

fn check_ttl(ttl: Duration) -> Result<Duration> {
    if ttl < LeaseOptions::MIN_TTL || ttl > LeaseOptions::MAX_TTL {
        return Err(Error::InvalidOptions(format!(
            "lease TTL {ttl:?} is outside {:?}..={:?}",
            LeaseOptions::MIN_TTL,
            LeaseOptions::MAX_TTL
        )));
    }
    let millis = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    Ok(Duration::from_millis(millis))
}

/// Checks a backend setting (timeout, interval): 1 ms to 1 hour.
///
/// # Errors
///
/// [`Error::InvalidOptions`] naming `what` when `d` is outside that range.
#[doc(hidden)] // for backends: `distlock_core::backend::check_setting`
pub fn check_setting(what: &str, d: Duration) -> Result<()> {
    if d < Duration::from_millis(1) || d > Duration::from_secs(3600) {
        return Err(Error::InvalidOptions(format!(
            "{what} {d:?} must be between 1 ms and an hour"
        )));
    }
    Ok(())
}

/// A safety margin for clock drift between client and server: the client
/// treats a lease as gone `ttl / 100 + 2 ms` before the server would expire it
/// (the Redlock paper's drift factor).
#[must_use]
pub fn clock_drift(ttl: Duration) -> Duration {
    (ttl / 100).saturating_add(Duration::from_millis(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ttls_are_typed_errors() {
        for bad in [
            Duration::ZERO,
            Duration::from_micros(999),
            Duration::from_millis(2),
            Duration::MAX,
            LeaseOptions::MAX_TTL + Duration::from_millis(1),
        ] {
            assert!(matches!(
                LeaseOptions::new(bad),
                Err(Error::InvalidOptions(_))
            ));
            assert!(matches!(
                LeaseOptions::manual(bad),
                Err(Error::InvalidOptions(_))
            ));
        }
    }

    #[test]
    fn ttl_is_whole_millis_and_interval_is_a_third() {
        let o = LeaseOptions::new(Duration::from_micros(3_000_700)).unwrap();
        assert_eq!(o.ttl(), Duration::from_secs(3));
        assert_eq!(o.ttl_millis(), 3000);
        assert_eq!(
            o.renewal(),
            Renewal::Watchdog {
                interval: Duration::from_secs(1)
            }
        );
        assert!(o.with_watchdog_interval(Duration::ZERO).is_err());
        assert!(o.with_watchdog_interval(Duration::from_secs(3)).is_err());
        assert!(o.with_watchdog_interval(Duration::from_millis(500)).is_ok());
        // (3000 - 32) / 2 = 1484 ms is the longest interval that can work.
        assert!(o
            .with_watchdog_interval(Duration::from_millis(1484))
            .is_ok());
        assert!(matches!(
            o.with_watchdog_interval(Duration::from_millis(2990)),
            Err(Error::InvalidOptions(_))
        ));
        assert!(o
            .with_watchdog_interval(Duration::from_millis(1485))
            .is_err());
    }

    #[test]
    fn ttls_at_or_below_the_drift_are_refused() {
        // 2 ms is all drift: such a lease would be born lost.
        for ms in [1, 2, 3, 9] {
            let ttl = Duration::from_millis(ms);
            assert!(LeaseOptions::new(ttl).is_err(), "{ms} ms");
            assert!(LeaseOptions::manual(ttl).is_err(), "{ms} ms");
        }
        let shortest = LeaseOptions::new(LeaseOptions::MIN_TTL).unwrap();
        let Renewal::Watchdog { interval } = shortest.renewal() else {
            panic!("watchdog expected");
        };
        assert!(interval > Duration::ZERO && interval <= max_interval(LeaseOptions::MIN_TTL));
    }

    #[test]
    fn max_hold_is_checked_and_kept() {
        let l = LeaseOptions::default()
            .max_hold(Duration::from_secs(60))
            .unwrap();
        assert_eq!(l.hold_limit(), Some(Duration::from_secs(60)));
        assert_eq!(LeaseOptions::default().hold_limit(), None);
        for bad in [Duration::ZERO, Duration::MAX] {
            assert!(matches!(
                LeaseOptions::default().max_hold(bad),
                Err(Error::InvalidOptions(_))
            ));
        }
    }

    #[test]
    fn drift_saturates() {
        assert_eq!(
            clock_drift(Duration::from_secs(1)),
            Duration::from_millis(12)
        );
        assert!(clock_drift(Duration::MAX) > Duration::ZERO);
    }
}
