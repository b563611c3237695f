//! What a backend implements and the helpers it builds on: the lease it
//! hands to a [`LockGuard`](crate::LockGuard), the status cell, the cleanup
//! drop-guard, the provider's lifecycle, id blocks, timeouts and settings.
//!
//! Users of distlock do not need this module; the facade does not re-export
//! it. A few items that only backends call live elsewhere and are hidden
//! from the docs, so that a user's page shows only what a user calls:
//! [`LockGuard::new`](crate::LockGuard)`(GuardParts, Arc<dyn LeaseBackend>)`
//! builds the guard of a lease just acquired (and starts its watchdog),
//! [`Leadership::new`](crate::Leadership)`(guard, candidate)` wraps an
//! election's, `Snapshot::empty(name, kind, backend)` starts an
//! [`inspect`](crate::Provider::inspect) answer, and
//! [`validate_candidate`] and [`check_setting`] check input.

mod ids;
mod timeout;
pub mod url;

pub use crate::election::validate_candidate;
use crate::error::{Error, Result};
pub use crate::lease::cleanup::{Cleanup, CleanupGuard};
pub use crate::lease::lifecycle::{Closed, Lifecycle};
pub use crate::lease::parts::GuardParts;
pub use crate::lease::signal::LeaseSignal;
pub use crate::lease::terms::{LeaseBackend, LeaseTerms};
pub use crate::lease::{check_setting, clock_drift};
pub use ids::{BlockIds, IdSource};
pub use timeout::with_timeout;

/// Checks a semaphore's number of permits: at least 1.
///
/// # Errors
///
/// [`Error::InvalidOptions`] for 0.
pub fn check_permits(permits: u32) -> Result<u32> {
    if permits == 0 {
        return Err(Error::InvalidOptions(
            "a semaphore needs at least one permit".into(),
        ));
    }
    Ok(permits)
}

/// Notes that the acquire call (or campaign) running in this task was just
/// woken by a sign that the lock came free (a release message, a watch
/// event): the start of a handoff, for the `distlock_handoff_seconds`
/// metric. Does nothing outside an acquire call, or without the `metrics`
/// feature.
#[inline]
pub fn woke() {
    crate::metrics::note_wakeup();
}

/// Runs an election's `campaign` future, recording it in the metrics as
/// an acquire call of primitive `election` and its leadership as a hold
/// (feature `metrics`; a plain `.await` without it). Backends wrap the body
/// of [`Election::campaign`](crate::Election::campaign) in it.
///
/// # Errors
///
/// The campaign's.
///
/// # Cancellation safety
///
/// As the campaign's: dropping it drops the campaign.
pub async fn measured_campaign(
    backend: &'static str,
    name: &crate::name::Name,
    campaign: impl std::future::Future<Output = crate::error::Result<crate::election::Leadership>>,
) -> crate::error::Result<crate::election::Leadership> {
    if !cfg!(feature = "metrics") {
        return campaign.await;
    }
    let labels = crate::metrics::Labels {
        backend,
        primitive: crate::inspect::PrimitiveKind::Election,
        name: name.clone(),
    };
    crate::metrics::measured(labels, true, true, campaign).await
}
