//! Fencing at the resource: the protected store refuses a write from a
//! holder whose lease was superseded, with the rule written once here.
//!
//! A lock's guard carries a fencing token ([`LockGuard::fencing_token`]),
//! strictly greater than every earlier holder's of the same name. A lock
//! alone cannot stop a holder that was paused past its lease (a GC pause,
//! a starved watchdog, a partition) from writing after the next holder
//! did: only the resource can, by remembering the highest token it has
//! admitted and refusing lower ones. This module states that rule once
//! ([`Highest::check`]); the stores implement it atomically with their
//! writes: [`MemFence`] in process, `distlock_redis::RedisFence` in Redis
//! (Lua scripts that check and write in one step).
//!
//! # The rule
//!
//! A resource keeps two numbers, [`Highest::token`] (the highest token it
//! admitted) and [`Highest::exclusive`] (the highest token of an exclusive
//! holder it admitted). A write carries a [`FenceToken`]: the guard's token
//! and how the guard holds.
//!
//! * An **exclusive** token `t` (a mutex, a fair mutex, the write side of a
//!   read-write lock, a leader's term) is admitted only if
//!   `t >= highest.token`. Strictly higher is a new holder; **equal is the
//!   same holder** writing again: tokens are unique per name, so the token
//!   itself identifies its holder, and no bookkeeping of holders is needed.
//! * A **shared** token `t` (a read guard, a semaphore permit) is admitted
//!   only if `t >= highest.exclusive`: it is refused once an exclusive
//!   holder that came after it has written, and never because of another
//!   shared holder.
//! * The check and the write are **atomic**: nothing can come between them.
//!   An admitted write raises `token` (and for an exclusive one `exclusive`)
//!   to `t` where `t` is higher. A **refused write changes nothing** (neither
//!   the data nor the numbers) and is [`Error::Stale`] `{ token, highest }`,
//!   `highest` being the number it was compared with
//!   ([`Error::is_stale`]; not retryable: a newer holder exists).
//! * A write whose store fails (a wrong type, an error of the user's own
//!   script) records nothing either.
//! * The numbers are readable at any time ([`Highest`]), and never go down.
//!
//! # Several holders at once: readers and permits
//!
//! Readers of a read-write lock and the permits of a semaphore hold
//! together, with interleaved tokens: a reader with token 5 may still be
//! reading, legitimately, after a reader with token 6 wrote its access log.
//! "At least the highest admitted" would refuse it with no lease lost (the
//! safety suite's slot store did exactly that under connection delays: a
//! permit holder refused because another permit, acquired later, had
//! claimed its slot first). So shared tokens are fenced **against the
//! exclusive holders only**:
//!
//! * a **read-write lock**: a writer's token is greater than every earlier
//!   reader's and writer's, a reader's greater than every earlier writer's
//!   ([`ReadWriteLock`](crate::ReadWriteLock)). Readers pass
//!   [`FenceToken::shared`], writers [`FenceToken::exclusive`]: a reader
//!   superseded by a writer is refused once that writer has written, and a
//!   writer superseded by anyone (a later reader included) is refused.
//! * a **semaphore**: every permit is shared, so the fence never refuses a
//!   permit holder for another permit's sake. No token rule can do better
//!   for one resource that N holders share: a permit held for a long time
//!   and a stale one look the same to it (the permit with token 5 may
//!   outlive permits 6 to 9, all released). What a semaphore protects with
//!   a fence is what each holder has **for itself**: give each unit of work
//!   its own resource, taken under its own exclusive lock (a mutex per job
//!   or per slot), or fence the shared resource against an exclusive holder
//!   of the same name's tokens. This is the "writers only" choice for
//!   semaphores, and "readers against writers" for read-write locks.
//!
//! A shared token passed as exclusive is safe but can refuse a live
//! reader (a false stale); an exclusive token passed as shared lets a
//! stale writer in behind a reader: pass the kind the guard holds.
//!
//! # Resource names
//!
//! Every fence (in process, Redis, PostgreSQL, the tower layer) takes the
//! same resource names, so a name that works on one works on all, and
//! checks them before it sends anything: a refused name is
//! [`Error::InvalidName`] ([`Error::is_invalid_input`]; the layer answers
//! `400 Bad Request`), nothing is written or recorded, and a PostgreSQL
//! transaction it was given stays usable. A resource name is
//!
//! * 1 to [`MAX_RESOURCE_LEN`] (1024) bytes of UTF-8;
//! * without control characters: no NUL (PostgreSQL cannot store it), tab,
//!   newline or other C0 control, nor U+007F to U+009F;
//! * with a `}` only after a Redis Cluster hash tag: a `{` followed, before
//!   the next `}`, by at least one character (`{user1}:profile`); the
//!   Redis fence keeps a key's fence in the key's slot by that tag;
//! * not of the shape of distlock's own Redis keys: a name that starts
//!   with `{` and has, right after a `}:`, one of the words `distlock`,
//!   `fence`, `released`, `fair`, `holder`, `revoke`, `waiting`,
//!   `handoff`, `listening`, `streak`, `elect`, `rw`, `sem`, `ids` or
//!   `redlock` (up to the next `:` or the end) is reserved. Those are the names of
//!   every key's fence (`{orders:42}:distlock:highest`) and of every
//!   lock's fencing counter, queue and records (`{orders/42}:fence`,
//!   `{orders/42}:rw:writer`, ...): a write through a fence never deletes
//!   or lowers another resource's fence, nor changes a lock's internals,
//!   even when the name comes from a request. Names that only look alike
//!   are ordinary names (`{user1}:profile`, `{user1}:fences`,
//!   `orders:fence`).
//!
//! The rule cannot know the keys of your locks themselves (on Redis, a
//! lock's key is the provider's key prefix followed by the lock's name):
//! keep the keys you write through a fence apart from them. Build a key
//! that comes from a request under a prefix of its own that no lock key
//! starts with (`data:` followed by the request's id, with the locks under
//! `RedisOptions::key_prefix("locks:")`), or keep the locks in another
//! Redis database than the data.
//!
//! Token 0 is never handed out by a lock and is [`Error::InvalidOptions`].
//! Neither panics.
//!
//! # Implementations and their context
//!
//! [`Fence`] is the part every store shares: [`Fence::admit`] checks and
//! records a token, and [`Fence::highest`] reads the numbers, both in a
//! context `Cx` that the store defines:
//!
//! * `Cx = ()` ([`MemFence`], `RedisFence`): the admission is a *barrier*.
//!   From its return on, every lower token is refused; it is atomic with
//!   nothing else. The writes themselves go through the store's own fenced
//!   writes, which check again atomically ([`MemFence::write`],
//!   `RedisFence::set`, ...). A barrier alone must never be taken as a
//!   licence to write unchecked: a holder admitted, then paused, would
//!   write after its successor.
//! * A transaction as `Cx` (the planned PostgreSQL fence,
//!   `impl<'t> Fence<tokio_postgres::Transaction<'t>>`): `admit` updates the
//!   resource's fence row `WHERE highest <= $token` on the caller's
//!   transaction, which keeps the row locked until it ends, so the user's
//!   own writes in that transaction commit (or roll back) together with
//!   the admission.
//! * A tower layer (planned) is generic over `F: Fence`: it reads the token
//!   and the resource from the request, calls [`Fence::admit`] and answers
//!   `409 Conflict` with [`Error::Stale`]'s `highest` for a stale one; the
//!   service behind it writes through the store's fenced writes with the
//!   same token (handed on in the request's extensions), or on the
//!   transaction the layer admitted in.
//!
//! # Example
//!
//! The facade re-exports this module as `distlock::fence` (its crate docs
//! have the same example with `use distlock::...`).
//!
//! ```
//! use distlock_core::fence::{FenceToken, MemFence};
//! use distlock_core::{mem::MemProvider, Provider};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_core::Result<()> {
//! let locks = MemProvider::new();
//! let orders: MemFence<u64> = MemFence::new();
//!
//! let old = locks.mutex("orders/42")?.lock().await?;
//! let stale = FenceToken::of(&old);
//! old.release().await?; // say its lease ran out while it was paused
//!
//! let new = locks.mutex("orders/42")?.lock().await?;
//! orders.write("orders/42", FenceToken::of(&new), |v| *v = Some(7))?;
//!
//! // The paused holder wakes up and writes: refused, nothing changed.
//! let err = orders.write("orders/42", stale, |v| *v = Some(1)).unwrap_err();
//! assert!(err.is_stale());
//! assert_eq!(orders.read("orders/42"), Some(7));
//! assert_eq!(orders.highest("orders/42")?.token, new.fencing_token());
//! new.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`LockGuard::fencing_token`]: crate::LockGuard::fencing_token

mod memory;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::guard::LockGuard;

pub use memory::MemFence;

/// The longest resource name a fence takes, in bytes.
pub const MAX_RESOURCE_LEN: usize = 1024;

/// How the holder of a token holds its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hold {
    /// Alone: a mutex, a fair mutex, the write side, a leader.
    Exclusive,
    /// Beside others: a read guard, a semaphore permit.
    Shared,
}

/// The token a write carries: a guard's fencing token and how it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FenceToken {
    token: u64,
    hold: Hold,
}

impl FenceToken {
    /// An exclusive holder's token (mutex, fair mutex, write side, leader's
    /// term).
    #[must_use]
    pub fn exclusive(token: u64) -> Self {
        FenceToken {
            token,
            hold: Hold::Exclusive,
        }
    }

    /// A shared holder's token (read guard, semaphore permit): fenced
    /// against exclusive holders only (see [the module docs](self)).
    #[must_use]
    pub fn shared(token: u64) -> Self {
        FenceToken {
            token,
            hold: Hold::Shared,
        }
    }

    /// The exclusive token of `guard` (a mutex's, a fair mutex's or a write
    /// guard's); use [`FenceToken::shared`] for a read guard or a permit.
    #[must_use]
    pub fn of(guard: &LockGuard) -> Self {
        FenceToken::exclusive(guard.fencing_token())
    }

    /// The token.
    #[must_use]
    pub fn token(self) -> u64 {
        self.token
    }

    /// How its holder holds.
    #[must_use]
    pub fn hold(self) -> Hold {
        self.hold
    }

    /// Whether its holder holds alone.
    #[must_use]
    pub fn is_exclusive(self) -> bool {
        self.hold == Hold::Exclusive
    }

    /// Checks the token is one a lock can hand out (not 0).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for token 0.
    pub fn check(self) -> Result<Self> {
        if self.token == 0 {
            return Err(Error::InvalidOptions(
                "fencing token 0: locks hand out tokens from 1".into(),
            ));
        }
        Ok(self)
    }
}

/// What a resource has admitted: the rule's two numbers (0 and 0 for a
/// resource that admitted nothing yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Highest {
    /// The highest token admitted, of any holder.
    pub token: u64,
    /// The highest token of an exclusive holder admitted.
    pub exclusive: u64,
}

impl Highest {
    /// The bar `token` must reach: [`Highest::token`] for an exclusive
    /// token, [`Highest::exclusive`] for a shared one.
    #[must_use]
    pub fn bar(self, token: FenceToken) -> u64 {
        match token.hold {
            Hold::Exclusive => self.token,
            Hold::Shared => self.exclusive,
        }
    }

    /// The rule: whether `token` is admitted, and the numbers after its
    /// write. Pure: a store calls it under its own atomicity.
    ///
    /// # Errors
    ///
    /// [`Error::Stale`] when `token` is below [`Highest::bar`];
    /// [`Error::InvalidOptions`] for token 0.
    pub fn check(self, token: FenceToken) -> Result<Highest> {
        let token = token.check()?;
        let bar = self.bar(token);
        if token.token < bar {
            return Err(Error::Stale {
                token: token.token,
                highest: bar,
            });
        }
        Ok(Highest {
            token: self.token.max(token.token),
            exclusive: match token.hold {
                Hold::Exclusive => token.token,
                Hold::Shared => self.exclusive,
            },
        })
    }
}

/// The words that, right after a `}:` in a name starting with `{`, make the
/// shape of distlock's own Redis keys: a fence (`{KEY}:distlock:highest`)
/// and a lock's internals (`{LOCK}:fence`, `{LOCK}:rw:writer`, ...; the
/// table of keys in `distlock_redis`'s docs).
const RESERVED_WORDS: [&str; 15] = [
    "distlock",
    "fence",
    "released",
    "fair",
    "holder",
    "revoke",
    "waiting",
    "handoff",
    "listening",
    "elect",
    "rw",
    "sem",
    "ids",
    "redlock",
    "streak",
];

/// Checks a resource name by [the rule](self#resource-names), before a
/// fence sends anything anywhere.
///
/// # Errors
///
/// [`Error::InvalidName`] for a name the rule refuses, its `reason` saying
/// which part of the rule.
pub fn check_resource(resource: &str) -> Result<&str> {
    let reason = if resource.is_empty() {
        "a fenced resource needs a name"
    } else if resource.len() > MAX_RESOURCE_LEN {
        "a fenced resource's name is at most 1024 bytes"
    } else if resource.chars().any(char::is_control) {
        "a fenced resource's name has no control characters (NUL, tab, newline, U+007F to U+009F, ...)"
    } else if resource.contains('}') && !has_hash_tag(resource) {
        "a fenced resource's name with a '}' needs a {hash tag} before it: a '{', then at least one character before the next '}'"
    } else if is_reserved(resource) {
        "a fenced resource's name of the shape {...}:WORD... is reserved for distlock's own keys (WORD: distlock, fence, released, fair, holder, revoke, waiting, handoff, listening, streak, elect, rw, sem, ids, redlock)"
    } else {
        return Ok(resource);
    };
    Err(Error::InvalidName {
        name: resource.chars().take(64).collect(),
        reason,
    })
}

/// Whether `resource` has a non-empty Redis Cluster hash tag: a `{`, and
/// before the next `}` after it, at least one character.
fn has_hash_tag(resource: &str) -> bool {
    resource
        .find('{')
        .is_some_and(|open| resource[open + 1..].find('}').is_some_and(|len| len > 0))
}

/// Whether `resource` has the shape of one of distlock's own keys: it
/// starts with `{`, and after one of its `}:`, the next `:`-separated part
/// is one of [`RESERVED_WORDS`].
fn is_reserved(resource: &str) -> bool {
    resource.starts_with('{')
        && resource.match_indices("}:").any(|(at, _)| {
            resource[at + 2..]
                .split(':')
                .next()
                .is_some_and(|word| RESERVED_WORDS.contains(&word))
        })
}

/// A store that fences its resources (see [the module docs](self)): it
/// admits a token by [the rule](Highest::check) and says what it admitted,
/// in a context `Cx` of its own (`()` for a store whose fenced writes are
/// single atomic calls; a transaction for a SQL store).
#[async_trait]
pub trait Fence<Cx: Send + ?Sized = ()>: Send + Sync {
    /// Admits `token` on `resource` in `cx` and records it: from then on,
    /// every token below it (by [the rule](Highest::check)) is refused.
    /// Atomic with what `cx` commits with it; with `Cx = ()` with nothing
    /// else (a barrier: write through the store's fenced writes).
    ///
    /// # Errors
    ///
    /// [`Error::Stale`] when `token` is refused (nothing recorded);
    /// [`Error::InvalidName`] / [`Error::InvalidOptions`] for a bad
    /// resource name or token 0; the store's own errors (a retryable one
    /// leaves the outcome unknown: retrying the same token is admitted as
    /// equal if the first attempt landed).
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future may leave the admission done or not, as a lost
    /// reply does; retry with the same token to know.
    async fn admit(&self, cx: &mut Cx, resource: &str, token: FenceToken) -> Result<Highest>;

    /// What `resource` has admitted so far.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad resource name; the store's own
    /// errors.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    async fn highest(&self, cx: &mut Cx, resource: &str) -> Result<Highest>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let h = Highest::default();
        let h = h.check(FenceToken::exclusive(3)).unwrap();
        assert_eq!(
            h,
            Highest {
                token: 3,
                exclusive: 3
            }
        );
        assert_eq!(h.check(FenceToken::exclusive(3)).unwrap(), h, "same holder");
        let e = h.check(FenceToken::exclusive(2)).unwrap_err();
        assert!(matches!(
            e,
            Error::Stale {
                token: 2,
                highest: 3
            }
        ));
        assert!(e.is_stale() && !e.is_retryable());
        // Readers 5 and 4 (4 acquired first, writes last): both admitted.
        let h = h.check(FenceToken::shared(5)).unwrap();
        let h = h.check(FenceToken::shared(4)).unwrap();
        assert_eq!(
            h,
            Highest {
                token: 5,
                exclusive: 3
            }
        );
        // A writer below a reader's token is superseded by that reader.
        assert!(h.check(FenceToken::exclusive(4)).unwrap_err().is_stale());
        let h = h.check(FenceToken::exclusive(6)).unwrap();
        assert!(matches!(
            h.check(FenceToken::shared(5)).unwrap_err(),
            Error::Stale {
                token: 5,
                highest: 6
            }
        ));
        assert!(h
            .check(FenceToken::exclusive(0))
            .unwrap_err()
            .is_invalid_input());
    }

    #[test]
    fn resource_names() {
        assert!(check_resource("").unwrap_err().is_invalid_input());
        assert!(check_resource(&"x".repeat(MAX_RESOURCE_LEN + 1))
            .unwrap_err()
            .is_invalid_input());
        assert_eq!(check_resource("a").unwrap(), "a");
        for bad in [
            "a\0b",
            "\0",
            "a\tb",
            "a\n",
            "\u{7f}",
            "\u{85}",
            "a}b",
            "{}x}",
            "{k}:distlock:highest",
            "{k}:distlock:highest:{k}x",
            "{k}:distlock",
            "{k}:fence",
            "{k}:fair:queue",
            "{k}:waiting:alive",
            "{k}:elect:leader",
            "{k}:rw:writer",
            "{k}:sem:permits",
            "{k}:ids",
            "{k}:redlock:fence",
            "{{app}:k}:fence",
            "{a}b}:holder",
        ] {
            let e = check_resource(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        }
        for ok in [
            "{k}:profile",
            "{k}:fences",
            "{k}:FENCE",
            "{k}fence",
            "k:fence",
            "x{k}:fence",
            "k:distlock:highest",
            "{k}:x:fence",
            "a{b",
            "}{a}",
            "caf\u{e9} \u{2028}",
        ] {
            assert_eq!(check_resource(ok).unwrap(), ok);
        }
    }

    /// Every word of the rule's docs is a reserved word, and back.
    #[test]
    fn the_docs_list_the_reserved_words() {
        let docs = include_str!("mod.rs");
        for word in RESERVED_WORDS {
            assert!(docs.contains(&format!("`{word}`")), "{word}");
            assert!(check_resource(&format!("{{k}}:{word}")).is_err(), "{word}");
        }
    }
}
