//! The cross-kind checks: one name is one lock. Written once, run on every
//! backend (`conformance_suite!(kinds fixture)`).
//!
//! For every ordered pair of different kinds of primitive (mutex, fair
//! mutex, the read and the write side of a read-write lock, a semaphore,
//! an election), [`cross_kind_pairs`] holds the first kind on a name and
//! checks that the second either waits for it (the mutex and the fair
//! mutex exclude each other: `try_lock` gives `None`, `lock_timeout` ends
//! in `None`, and after the release it gets in) or fails with
//! [`Error::Conflict`] (every other pair), and that once the first is
//! released the second gets the name. [`cross_kind_race`] starts two kinds
//! at once, round after round, and checks that they never both hold.
// Checks unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, LeaseOptions, LockGuard, Provider};
use tokio::sync::Barrier;

use crate::conformance::{Fixture, SLACK};
use crate::unique_name;

/// One kind of primitive on a name, as the cross-kind checks take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The (unfair) mutex.
    Mutex,
    /// The fair mutex.
    Fair,
    /// The read side of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
    /// A semaphore of two permits (one taken: a permit is still free, and
    /// the other kind is refused all the same).
    Semaphore,
    /// A leader election (the leader holds the name).
    Election,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Mutex => "mutex",
            Kind::Fair => "fair mutex",
            Kind::Read => "read side",
            Kind::Write => "write side",
            Kind::Semaphore => "semaphore",
            Kind::Election => "election",
        })
    }
}

/// Every kind.
pub const ALL: [Kind; 6] = [
    Kind::Mutex,
    Kind::Fair,
    Kind::Read,
    Kind::Write,
    Kind::Semaphore,
    Kind::Election,
];

/// What the second kind meets while the first holds the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meets {
    /// It waits for the name (the two exclude each other).
    Waits,
    /// It fails with [`Error::Conflict`].
    Conflict,
}

/// The table every backend keeps, for two different kinds (the two sides of
/// one read-write lock are one kind, with their own rules).
#[must_use]
pub fn table(first: Kind, second: Kind) -> Option<Meets> {
    let mutex = |k| matches!(k, Kind::Mutex | Kind::Fair);
    let rw = |k| matches!(k, Kind::Read | Kind::Write);
    if first == second || (rw(first) && rw(second)) {
        None
    } else if mutex(first) && mutex(second) {
        Some(Meets::Waits)
    } else {
        Some(Meets::Conflict)
    }
}

/// A hold of one kind: a guard, or a leadership.
enum Hold {
    Guard(LockGuard),
    Leader(distlock_core::Leadership),
}

impl Hold {
    async fn release(self) {
        match self {
            Hold::Guard(g) => g.release().await.expect("release"),
            Hold::Leader(l) => l.resign().await.expect("resign"),
        }
    }
}

fn lease<F: Fixture>(fx: &F, client: &dyn Provider) -> LeaseOptions {
    if fx.session() {
        client.default_lease()
    } else {
        LeaseOptions::new(Duration::from_secs(30)).expect("valid TTL")
    }
}

/// How an attempt ended.
enum Got {
    Held(Hold),
    /// Not acquired (try_lock's `None`, a timeout).
    Nothing,
    Error(Error),
}

/// One attempt by `kind` on `name`: `try_lock` when `wait` is `None`, else
/// `lock_timeout(wait)` (a campaign bounded by `wait` for the election).
async fn attempt<F: Fixture>(
    fx: &F,
    client: &dyn Provider,
    name: &str,
    kind: Kind,
    wait: Option<Duration>,
) -> Got {
    let lease = lease(fx, client);
    let lock = match kind {
        Kind::Mutex => client.with_lease(lease).unwrap().mutex(name).unwrap(),
        Kind::Fair => client.with_lease(lease).unwrap().fair_mutex(name).unwrap(),
        Kind::Read => client
            .with_lease(lease)
            .unwrap()
            .rw_lock(name)
            .unwrap()
            .read(),
        Kind::Write => client
            .with_lease(lease)
            .unwrap()
            .rw_lock(name)
            .unwrap()
            .write(),
        Kind::Semaphore => client
            .with_lease(lease)
            .unwrap()
            .semaphore(name, 2)
            .unwrap(),
        Kind::Election => {
            let election = client.with_lease(lease).unwrap().election(name).unwrap();
            // A campaign has no try form: a bound stands for it, long
            // enough for a refusal to arrive on a loaded machine (an
            // election is refused by every other kind, never waits).
            let bound = wait.unwrap_or(SLACK).max(SLACK);
            return match tokio::time::timeout(bound, election.campaign("cross-kind")).await {
                Ok(Ok(leadership)) => Got::Held(Hold::Leader(leadership)),
                Ok(Err(e)) => Got::Error(e),
                Err(_) => Got::Nothing,
            };
        }
    };
    let result = match wait {
        None => lock.try_lock().await,
        Some(d) => lock.lock_timeout(d).await,
    };
    match result {
        Ok(Some(g)) => Got::Held(Hold::Guard(g)),
        Ok(None) => Got::Nothing,
        Err(e) => Got::Error(e),
    }
}

/// Checks one ordered pair; returns what went wrong, if anything.
async fn check_pair<F: Fixture>(
    fx: &F,
    clients: &[Arc<dyn Provider>],
    first: Kind,
    second: Kind,
    meets: Meets,
) -> Option<String> {
    let name = unique_name("cross-kind");
    let (a, b) = (clients[0].as_ref(), clients[1].as_ref());
    let pair = format!("{second} while the {first} holds");
    let held = match attempt(fx, a, &name, first, Some(SLACK)).await {
        Got::Held(h) => h,
        Got::Nothing => return Some(format!("{pair}: the {first} did not get a free name")),
        Got::Error(e) => return Some(format!("{pair}: the {first} failed on a free name: {e}")),
    };
    let mut wrong = None;
    // A timed wait that should be refused gets a long deadline, so that a
    // slow refusal is not mistaken for a wait; one that should wait ends in
    // `None` whatever its length.
    let timed = match meets {
        Meets::Waits => Duration::from_millis(300),
        Meets::Conflict => SLACK,
    };
    for wait in [None, Some(timed)] {
        let how = if wait.is_none() { "try" } else { "timed wait" };
        match (attempt(fx, b, &name, second, wait).await, meets) {
            (Got::Held(h), _) => {
                h.release().await;
                wrong = Some(format!("{pair}: both held ({how})"));
                break;
            }
            (Got::Nothing, Meets::Waits) => {}
            (Got::Error(e), Meets::Conflict) if e.is_conflict() => {
                let text = e.to_string();
                if !text.contains(&name) {
                    wrong = Some(format!("{pair}: the conflict does not name {name}: {text}"));
                }
            }
            (Got::Nothing, Meets::Conflict) => {
                wrong = Some(format!("{pair}: it waited ({how}), Conflict expected"));
                break;
            }
            (Got::Error(e), _) => {
                wrong = Some(format!("{pair}: {e:?} ({how}), expected to {meets:?}"));
                break;
            }
        }
    }
    held.release().await;
    // The name is free again: the second kind gets it (nothing of the first
    // kind is left to refuse it).
    match attempt(fx, b, &name, second, Some(SLACK * 2)).await {
        Got::Held(h) => h.release().await,
        Got::Nothing => {
            wrong.get_or_insert(format!("{pair}: not acquired after the release"));
        }
        Got::Error(e) => {
            wrong.get_or_insert(format!("{pair}: after the release: {e}"));
        }
    }
    wrong
}

/// For every ordered pair of different kinds: while the first holds a name,
/// the second waits (mutex and fair mutex) or fails with `Conflict`; after
/// the release it gets in. Reports every pair that does otherwise.
pub async fn cross_kind_pairs<F: Fixture>(fx: &F) {
    let clients = [fx.client().await, fx.client().await];
    let mut wrong = Vec::new();
    for first in ALL {
        for second in ALL {
            if let Some(meets) = table(first, second) {
                if let Some(w) = check_pair(fx, &clients, first, second, meets).await {
                    wrong.push(w);
                }
            }
        }
    }
    for c in &clients {
        c.close().await.expect("close");
    }
    assert!(
        wrong.is_empty(),
        "cross-kind table broken:\n{}",
        wrong.join("\n")
    );
}

/// Two kinds start on one name at the same moment, round after round, for
/// every pair of different kinds: they never both hold (an in-test count of
/// holders, checked while holding).
pub async fn cross_kind_race<F: Fixture>(fx: &F) {
    const ROUNDS: usize = 8;
    let clients = [fx.client().await, fx.client().await];
    let mut both = Vec::new();
    let mut pairs = Vec::new();
    for (i, first) in ALL.iter().enumerate() {
        for second in &ALL[i + 1..] {
            if table(*first, *second).is_some() {
                pairs.push((*first, *second));
            }
        }
    }
    for (first, second) in pairs {
        for _ in 0..ROUNDS {
            let name = unique_name("kind-race");
            let holding = AtomicUsize::new(0);
            let overlap = AtomicUsize::new(0);
            let barrier = Barrier::new(2);
            let side = |client: &Arc<dyn Provider>, kind: Kind| {
                let (name, holding, overlap, barrier) = (&name, &holding, &overlap, &barrier);
                let client = Arc::clone(client);
                async move {
                    barrier.wait().await;
                    let got = attempt(fx, client.as_ref(), name, kind, None).await;
                    if let Got::Held(h) = got {
                        if holding.fetch_add(1, Ordering::SeqCst) > 0 {
                            overlap.fetch_add(1, Ordering::SeqCst);
                        }
                        // Hold long enough for the other side's attempt to land.
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        if holding.load(Ordering::SeqCst) > 1 {
                            overlap.fetch_add(1, Ordering::SeqCst);
                        }
                        holding.fetch_sub(1, Ordering::SeqCst);
                        h.release().await;
                    }
                }
            };
            tokio::join!(side(&clients[0], first), side(&clients[1], second));
            if overlap.load(Ordering::SeqCst) > 0 {
                both.push(format!("{first} and {second} on {name}"));
            }
        }
    }
    for c in &clients {
        c.close().await.expect("close");
    }
    assert!(
        both.is_empty(),
        "two kinds held one name at once:\n{}",
        both.join("\n")
    );
}
