//! The validated, backend-portable name of a lock, election or id generator.

use std::fmt;

use crate::error::{Error, Result};

/// A validated name, valid for every backend.
///
/// # Rule
///
/// * 1 to [`Name::MAX_LEN`] bytes;
/// * one or more segments separated by `/`; no leading, trailing or doubled
///   `/`; no segment is `.` or `..`;
/// * each segment uses only ASCII letters, digits, `-`, `_`, `.` and `:`;
/// * no segment after the first is the name of a node that a ZooKeeper
///   recipe (distlock's, Curator's or kazoo's) creates inside a lock:
///   * `_unfair_lock` (the mutex's node), `_unfair_lock-asked-` followed by
///     digits (a request to its holder to let go), `locks` and `leases` (the
///     semaphore's);
///   * a queue node: a segment that ends in one of `-lock-`, `__lock__`,
///     `-latch-`, `__READ__` or `__WRIT__` followed by a sequence number
///     (ten or more digits, or `-` and digits), such as
///     `_c_1f-lock-0000000042` or `x__lock__0000000007`.
///
///   On ZooKeeper each segment is a node inside the node of the name before
///   it, so `orders/_unfair_lock` would be the node that shows the mutex
///   `orders` held. Refusing these names everywhere keeps two different
///   names two independent locks on every backend, and a name valid on one
///   backend valid on all. The first segment may be anything: it is a
///   child of the base path, not of a lock.
///
/// # Mapping to backends
///
/// * **Redis**: the lock key is the configured prefix followed by the name,
///   byte for byte (`orders/42` with an empty prefix is the key `orders/42`),
///   so other clients (redis-py's `Lock("orders/42")`) can share it.
///   Auxiliary keys wrap the name in a hash tag (`{orders/42}:fence`); since a
///   name never contains braces, they hash to the lock key's cluster slot.
/// * **ZooKeeper**: each segment is one node under the provider's base path
///   (`orders/42` is `/<base>/orders/42`); the lock's children live below it,
///   under the reserved names above.
/// * **In-process**: the name is the key of a map.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// The longest name accepted, in bytes.
    pub const MAX_LEN: usize = 200;

    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when `name` breaks the rule above.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let s = name.as_ref();
        validate(s).map_err(|reason| Error::InvalidName {
            name: s.chars().take(64).collect(),
            reason,
        })?;
        Ok(Name(s.to_owned()))
    }

    /// The name as a string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `/`-separated segments of the name.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// This name followed by `/` and `suffix`, validated.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when the result is not a valid name.
    pub fn join(&self, suffix: &str) -> Result<Self> {
        Name::new(format!("{}/{suffix}", self.0))
    }
}

fn validate(s: &str) -> std::result::Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty");
    }
    if s.len() > Name::MAX_LEN {
        return Err("longer than 200 bytes");
    }
    for segment in s.split('/') {
        if segment.is_empty() {
            return Err("empty segment (leading, trailing or doubled '/')");
        }
        if segment == "." || segment == ".." {
            return Err("segment '.' or '..'");
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err("only ASCII letters, digits, '-', '_', '.', ':' and '/' are allowed");
        }
    }
    if s.split('/').skip(1).any(reserved) {
        return Err(
            "a segment after the first is a node name that ZooKeeper recipes create \
             inside a lock ('_unfair_lock', 'locks', 'leases', or a queue node such as \
             'x-lock-0000000001')",
        );
    }
    Ok(())
}

/// The markers after which a ZooKeeper recipe's queue node carries its
/// sequence: Curator's lock (`InterProcessMutex`, the semaphore's lock),
/// kazoo's lock, Curator's `LeaderLatch`, and Curator's read-write lock.
const QUEUE_MARKERS: [&str; 5] = ["-lock-", "__lock__", "-latch-", "__READ__", "__WRIT__"];

/// Whether `segment` (after the first) is a node name some ZooKeeper
/// recipe creates inside a lock's node: as narrow as the children those
/// recipes recognise (every queue parser reads the sequence after the last
/// marker, so a segment is refused when, for some marker, what follows its
/// last occurrence is a sequence).
fn reserved(segment: &str) -> bool {
    if matches!(segment, "_unfair_lock" | "locks" | "leases") {
        return true;
    }
    if segment
        .strip_prefix("_unfair_lock-asked-")
        .is_some_and(|czxid| !czxid.is_empty() && czxid.bytes().all(|b| b.is_ascii_digit()))
    {
        return true;
    }
    QUEUE_MARKERS.iter().any(|marker| {
        segment
            .rsplit_once(marker)
            .is_some_and(|(_, rest)| is_sequence(rest))
    })
}

/// A sequence as a ZooKeeper server appends it (`%010d`: ten digits, more
/// past 2^31 on some servers, or a minus sign once the counter wrapped).
fn is_sequence(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let long_enough = s.starts_with('-') || digits.len() >= 10;
    !digits.is_empty() && long_enough && digits.bytes().all(|b| b.is_ascii_digit())
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for Name {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        Name::new(s)
    }
}

impl TryFrom<String> for Name {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Name::new(s)
    }
}

impl std::str::FromStr for Name {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Name::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_portable_names() {
        for ok in ["a", "orders/42", "svc:payments/lock-1", "a.b_c-d", "x/y/z"] {
            assert_eq!(Name::new(ok).unwrap().as_str(), ok);
        }
        assert!(Name::new("a".repeat(Name::MAX_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_names_with_typed_error() {
        let long = "a".repeat(Name::MAX_LEN + 1);
        for bad in [
            "", "/a", "a/", "a//b", ".", "a/../b", "a b", "{a}", "a\0b", "ä", "a*", "\n", &long,
        ] {
            match Name::new(bad) {
                Err(Error::InvalidName { .. }) => {}
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn zookeeper_internal_node_names_are_refused_after_the_first_segment() {
        for bad in [
            "x/_unfair_lock",
            "x/_unfair_lock-asked-42",
            "x/locks",
            "x/leases",
            "a/b/leases",
            "x/locks/_c_0f-lock-0000000001",
            "x/_c_0f1e-lock-0000000042",
            "x/any-lock-0000000042",
            "x/abc__lock__0000000007",
            "x/_c_0f-latch-0000000003",
            "x/_c_0f-__READ__0000000001",
            "x/_c_0f-__WRIT__0000000002",
            "x/a-lock-12345678901",
            // A sequence the server printed negative (past 2^31).
            "x/_c_0f-lock--2147483648",
            "x/y__lock__-1",
        ] {
            match Name::new(bad) {
                Err(Error::InvalidName { reason, .. }) => {
                    assert!(reason.contains("ZooKeeper"), "{bad:?}: {reason}");
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        // As narrow as the recipes' own node names: the first segment (a
        // child of the base path), near misses, and a marker whose last
        // occurrence is not followed by a sequence stay valid.
        for ok in [
            "_unfair_lock",
            "locks",
            "leases/x",
            "_c_0f-lock-0000000001",
            "x/_unfair_lock2",
            "x/_unfair_lock-asked-",
            "x/_unfair_lock-asked-x",
            "x/unfair_lock",
            "x/lock",
            "x/lease",
            "x/my-locks",
            "x/a-lock-123",
            "x/a-lock-000000000a",
            "x/a-lock-",
            "x/a-lock--",
            "x/a-lock-0000000001-b",
            "x/a-lease-0000000001",
            "x/a-lock-0000000001-lock-x",
            "x/a__rlock__0000000001",
            "x/READ0000000001",
        ] {
            assert!(Name::new(ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn segments_and_join() {
        let n = Name::new("a/b").unwrap();
        assert_eq!(n.segments().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(n.join("c").unwrap().as_str(), "a/b/c");
        assert!(n.join("").is_err());
        assert!(n.join("_unfair_lock").is_err());
    }
}
