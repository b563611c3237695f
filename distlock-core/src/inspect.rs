//! Operations: who holds a name, since when, with which token, who waits
//! ([`Provider::inspect`](crate::Provider::inspect)), the operator's
//! [`Provider::force_release`](crate::Provider::force_release), and the
//! owner identity every provider stores with its holds.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::name::Name;

/// Which primitive of a name. One name is one lock: while one kind holds a
/// name, another kind waits for it (the mutex and the fair mutex) or is
/// refused with [`Error::Conflict`] (every other pair; see the crate docs'
/// table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PrimitiveKind {
    /// The (unfair) mutex.
    Mutex,
    /// The fair (FIFO) mutex. On Redis it shares the mutex's lock key, so
    /// both kinds show the same holder.
    FairMutex,
    /// A read-write lock: readers and the writer.
    ReadWrite,
    /// A counting semaphore: one holder per permit taken.
    Semaphore,
    /// A leader election: the leader (as a holder) and the candidates
    /// waiting.
    Election,
}

impl PrimitiveKind {
    /// Every kind, in the order above.
    pub const ALL: [PrimitiveKind; 5] = [
        PrimitiveKind::Mutex,
        PrimitiveKind::FairMutex,
        PrimitiveKind::ReadWrite,
        PrimitiveKind::Semaphore,
        PrimitiveKind::Election,
    ];

    /// The short name: `mutex`, `fair`, `rw`, `semaphore`, `election`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PrimitiveKind::Mutex => "mutex",
            PrimitiveKind::FairMutex => "fair",
            PrimitiveKind::ReadWrite => "rw",
            PrimitiveKind::Semaphore => "semaphore",
            PrimitiveKind::Election => "election",
        }
    }
}

impl PrimitiveKind {
    /// The kind as a noun, for messages: `mutex`, `fair mutex`,
    /// `read-write lock`, `semaphore`, `election`.
    /// Bare, without an article ([`Error::kind_conflict`](crate::Error::kind_conflict)
    /// adds "a" or "an").
    #[must_use]
    pub fn noun(self) -> &'static str {
        match self {
            PrimitiveKind::Mutex => "mutex",
            PrimitiveKind::FairMutex => "fair mutex",
            PrimitiveKind::ReadWrite => "read-write lock",
            PrimitiveKind::Semaphore => "semaphore",
            PrimitiveKind::Election => "election",
        }
    }
}

impl fmt::Display for PrimitiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PrimitiveKind {
    type Err = Error;

    /// Parses the short name ([`PrimitiveKind::as_str`]); also `fair_mutex`,
    /// `rwlock`, `read_write`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "mutex" => PrimitiveKind::Mutex,
            "fair" | "fair_mutex" | "fair-mutex" => PrimitiveKind::FairMutex,
            "rw" | "rwlock" | "read_write" | "read-write" => PrimitiveKind::ReadWrite,
            "semaphore" => PrimitiveKind::Semaphore,
            "election" => PrimitiveKind::Election,
            _ => {
                return Err(Error::InvalidOptions(format!(
                    "unknown kind {s:?}: use mutex, fair, rw, semaphore or election"
                )))
            }
        })
    }
}

/// What a holder holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldRole {
    /// The sole holder of a mutex or fair mutex.
    Exclusive,
    /// A read share of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
    /// One permit of a semaphore.
    Permit,
    /// The leader of an election.
    Leader,
}

/// How long a hold lasts, as far as the backend can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLeft {
    /// A TTL lease with this much left on the server's clock.
    Ttl(Duration),
    /// Held for as long as this ZooKeeper session lives.
    Session {
        /// The session id (the node's `ephemeralOwner`).
        session_id: i64,
    },
    /// No expiry: a lease that was set without one (by a foreign client or
    /// by hand).
    NoExpiry,
}

/// One holder of a name, read without taking anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// What it holds.
    pub role: HoldRole,
    /// The owner identity its provider stored (`label@host:pid`, see
    /// [`owner_identity`]); `None` for a foreign holder that stored none.
    pub owner: Option<String>,
    /// `Some(what is known)` for a hold made by another client (redis-py,
    /// Curator, kazoo, a hand-set key); `None` for distlock's own holds.
    pub foreign: Option<String>,
    /// Its fencing token, where the backend records one.
    pub fencing_token: Option<u64>,
    /// When it acquired, by the server's (or the holder's) clock, where known.
    pub acquired_at: Option<SystemTime>,
    /// How long the hold lasts.
    pub lease: LeaseLeft,
    /// Whether someone asked it to release
    /// ([`Provider::request_release`](crate::Provider::request_release), or
    /// a Curator `Revoker` on ZooKeeper) and it still holds.
    pub release_requested: bool,
}

/// Who waits for a name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waiters {
    /// How many wait (queued waiters; an unfair mutex's waiters are not
    /// recorded anywhere and count 0).
    pub count: usize,
    /// Their owner identities, first in line first, where the backend
    /// records them (foreign waiters are left out).
    pub owners: Vec<String>,
}

/// Who leads an election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The candidate id the leader campaigned with.
    pub id: String,
    /// The leader's term: its fencing token, strictly greater than every
    /// earlier leader's term of the same election.
    pub term: u64,
}

/// A name's state, read without taking anything and without changing
/// anything ([`Provider::inspect`](crate::Provider::inspect)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The name.
    pub name: Name,
    /// The primitive.
    pub kind: PrimitiveKind,
    /// The backend (`"mem"`, `"redis"`, `"zookeeper"`, ...).
    pub backend: &'static str,
    /// Who holds it: none, one, or several (readers, permits).
    pub holders: Vec<Holder>,
    /// Who waits.
    pub waiters: Waiters,
    /// An election's leader and term.
    pub leader: Option<LeaderInfo>,
    /// A semaphore's number of permits, as its holders recorded it.
    pub permits: Option<u32>,
}

impl Snapshot {
    /// An empty snapshot: nobody holds, nobody waits.
    #[must_use]
    #[doc(hidden)] // for backends, not users
    pub fn empty(name: Name, kind: PrimitiveKind, backend: &'static str) -> Self {
        Snapshot {
            name,
            kind,
            backend,
            holders: Vec::new(),
            waiters: Waiters::default(),
            leader: None,
            permits: None,
        }
    }

    /// Whether anybody holds it.
    #[must_use]
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }
}

/// The longest owner label.
pub const MAX_LABEL: usize = 64;

/// The owner identity of a provider: `host:pid`, or `label@host:pid` with a
/// label. The host is the machine's host name (`/proc/sys/kernel/hostname`,
/// else `$HOSTNAME`, else `localhost`).
///
/// # Errors
///
/// [`Error::InvalidOptions`] for a label that is empty, longer than
/// [`MAX_LABEL`] bytes, or has characters other than ASCII letters, digits
/// and `-`, `_`, `.`, `:`, `/`.
pub fn owner_identity(label: Option<&str>) -> Result<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned());
    let base = format!("{host}:{}", std::process::id());
    match label {
        None => Ok(base),
        Some(label) => Ok(format!("{}@{base}", check_label(label)?)),
    }
}

/// Checks an owner label (see [`owner_identity`]).
///
/// # Errors
///
/// As [`owner_identity`].
pub fn check_label(label: &str) -> Result<&str> {
    let ok = !label.is_empty()
        && label.len() <= MAX_LABEL
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
    if ok {
        Ok(label)
    } else {
        Err(Error::InvalidOptions(format!(
            "owner label {:?} must be 1-{MAX_LABEL} ASCII letters, digits, '-', '_', '.', ':' or '/'",
            label.chars().take(MAX_LABEL + 8).collect::<String>()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_bad_kinds_are_typed() {
        for kind in PrimitiveKind::ALL {
            assert_eq!(kind.as_str().parse::<PrimitiveKind>().unwrap(), kind);
        }
        assert_eq!(
            "RWLOCK".parse::<PrimitiveKind>().unwrap(),
            PrimitiveKind::ReadWrite
        );
        assert!(matches!(
            "queue".parse::<PrimitiveKind>(),
            Err(Error::InvalidOptions(_))
        ));
    }

    #[test]
    fn owner_identity_is_host_pid_with_an_optional_label() {
        let plain = owner_identity(None).unwrap();
        assert!(
            plain.ends_with(&format!(":{}", std::process::id())),
            "{plain}"
        );
        let labelled = owner_identity(Some("billing-worker")).unwrap();
        assert_eq!(labelled, format!("billing-worker@{plain}"));
        for bad in ["", "a b", "x@y", &"l".repeat(MAX_LABEL + 1), "é"] {
            assert!(matches!(
                owner_identity(Some(bad)),
                Err(Error::InvalidOptions(_))
            ));
        }
    }
}
