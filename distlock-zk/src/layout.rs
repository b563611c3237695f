//! The node layout every recipe and `ops` share: node names, the data our
//! nodes carry, and the parsing of sequences and kinds from children's
//! names. Pure functions: no request is sent from here.

use distlock_core::Name;

/// The unfair lock's node under the lock's directory.
pub(crate) const UNFAIR_NODE: &str = "_unfair_lock";

/// The node that asks the unfair lock's hold created at `czxid` to let go:
/// `_unfair_lock-asked-<czxid>`, beside the unfair node, ephemeral in the
/// asking session. Its name holds the hold's `czxid`, so a request lands
/// on the hold that was read and on no later one: the unfair node's path
/// is shared, and a node created again there starts at data version 0
/// like the one read, so a versioned write could not tell them apart.
pub(crate) fn unfair_request(czxid: i64) -> String {
    format!("{UNFAIR_NODE}-asked-{czxid}")
}

/// Curator's `READ_LOCK_NAME`.
pub(crate) const READ: &str = "__READ__";

/// Curator's `WRITE_LOCK_NAME` (the same length as `READ`).
pub(crate) const WRITE: &str = "__WRIT__";

/// The semaphore's internal lock's directory under the lock's.
pub(crate) const LOCKS: &str = "locks";

/// The semaphore's lease nodes' directory under the lock's.
pub(crate) const LEASES: &str = "leases";

/// A kind of primitive, as its nodes show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Mutex,
    Fair,
    Rw,
    Semaphore,
    Election,
}

impl Kind {
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Fair => "fair mutex",
            Kind::Rw => "read-write lock",
            Kind::Semaphore => "semaphore",
            Kind::Election => "election",
        }
    }

    /// The kinds that are one lock: the mutex and the fair mutex.
    pub(crate) fn family(self) -> Kind {
        match self {
            Kind::Fair => Kind::Mutex,
            k => k,
        }
    }
}

/// The kind of a child of a lock's directory, and its sequence (`None` for
/// the unfair node and the semaphore's `leases` directory); `None` for a
/// child of no kind (the semaphore's `locks`, foreign nodes).
pub(crate) fn classify(child: &str) -> Option<(Kind, Option<u64>)> {
    if child == UNFAIR_NODE {
        return Some((Kind::Mutex, None));
    }
    if child == LEASES {
        return Some((Kind::Semaphore, None));
    }
    if let Some((_, digits)) = child.rsplit_once(WRITE).or_else(|| child.rsplit_once(READ)) {
        return sequence_digits(digits)
            .ok()
            .flatten()
            .map(|s| (Kind::Rw, Some(s)));
    }
    if let Ok(Some(s)) = sequence(child, "latch") {
        return Some((Kind::Election, Some(s)));
    }
    if let Ok(Some(s)) = sequence(child, "lock") {
        return Some((Kind::Fair, Some(s)));
    }
    None
}
/// The directory of a primitive: root + `/` + name.
pub(crate) fn dir(root: &str, name: &Name) -> String {
    format!("{root}/{name}")
}
/// The first word of our nodes' data.
const MARK: &str = "distlock";

/// The data Curator's `Revoker.attemptRevoke` writes on a lock node to ask
/// its holder to let go (`LockInternals.REVOKE_MESSAGE`); a revocable
/// Curator holder (`makeRevocable`) watches its node for it.
pub(crate) const REVOKE: &[u8] = b"__REVOKE__";

/// Whether a holder's node carries a request to release: its data was set
/// after its create (every node starts at data version 0, and neither
/// distlock nor Curator's and kazoo's lock recipes set a holder's data,
/// except to ask: `request_release` writes the data again on our queue
/// nodes, `__REVOKE__` on foreign ones, as Curator's `Revoker`; an earlier
/// distlock version also wrote our unfair node's, which this version asks
/// through a node of its own, [`unfair_request`]), or it holds
/// `__REVOKE__`.
pub(crate) fn asked(data: &[u8], version: i32) -> bool {
    version > 0 || data == REVOKE
}

/// The data of our lock nodes: `distlock owner=<owner>`.
pub(crate) fn owner_data(owner: &str) -> Vec<u8> {
    format!("{MARK} owner={owner}").into_bytes()
}

/// What our data says: `None` when it is not ours.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Ours {
    pub(crate) owner: Option<String>,
    pub(crate) permits: Option<u32>,
}

/// Parses `distlock word=value…` (words in any order; unknown words are
/// skipped, so more can be added).
pub(crate) fn parse(data: &[u8]) -> Option<Ours> {
    let mut words = std::str::from_utf8(data).ok()?.split_ascii_whitespace();
    if words.next()? != MARK {
        return None;
    }
    let mut ours = Ours::default();
    for word in words {
        if let Some(owner) = word.strip_prefix("owner=") {
            ours.owner = Some(owner.to_owned());
        } else if let Some(permits) = word.strip_prefix("permits=") {
            ours.permits = permits.parse().ok();
        }
    }
    Some(ours)
}

/// The election node name's tag before `-latch-`: `o=<owner>` with every
/// byte but ASCII letters, digits, `_`, `.`, `:`, `@` escaped as `%XX` (so
/// no `-` or `/` is left in it).
pub(crate) fn latch_tag(owner: &str) -> String {
    let mut tag = String::from("o=");
    for b in owner.bytes() {
        if b.is_ascii_alphanumeric() || b"_.:@".contains(&b) {
            tag.push(char::from(b));
        } else {
            tag.push_str(&format!("%{b:02X}"));
        }
    }
    tag
}

/// The owner in an election node's name (see [`latch_tag`]), if it has one.
pub(crate) fn latch_owner(child: &str) -> Option<String> {
    let (_, rest) = child.split_once("-o=")?;
    let escaped = rest.split('-').next()?;
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut it = escaped.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hex = [it.next()?, it.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes).ok()
}
/// The data of our lease nodes: `distlock permits=N owner=<identity>`.
pub(crate) fn lease_data(permits: u32, owner: &str) -> Vec<u8> {
    format!("distlock permits={permits} owner={owner}").into_bytes()
}

/// The permits in a lease node's data, if distlock wrote it.
pub(crate) fn permits_of(data: &[u8]) -> Option<u32> {
    let mut words = std::str::from_utf8(data).ok()?.split_ascii_whitespace();
    if words.next()? != "distlock" {
        return None;
    }
    words.find_map(|w| w.strip_prefix("permits="))?.parse().ok()
}
/// A queue's sequence counter went past `i32::MAX`: the server prints it
/// negative, and the queue order is lost.
#[derive(Debug)]
pub(crate) struct Wrapped;

/// The sequence number of a queue child of `marker` (`lock`, `latch`):
/// Curator's `…-lock-0000000042` and, for locks, kazoo's
/// `…__lock__0000000042`. `Ok(None)` for a child that is not a queue node;
/// `Err(Wrapped)` for a sequence the server printed negative.
pub(crate) fn sequence(child: &str, marker: &str) -> std::result::Result<Option<u64>, Wrapped> {
    let curator = format!("-{marker}-");
    let kazoo = format!("__{marker}__");
    let Some(digits) = child
        .rsplit_once(curator.as_str())
        .or_else(|| {
            (marker == "lock")
                .then(|| child.rsplit_once(kazoo.as_str()))
                .flatten()
        })
        .map(|(_, d)| d)
    else {
        return Ok(None);
    };
    sequence_digits(digits)
}

/// The sequence a server appended to a node name (`0000000042`): `Ok(None)`
/// for anything else, `Err(Wrapped)` for a sequence printed negative.
pub(crate) fn sequence_digits(digits: &str) -> std::result::Result<Option<u64>, Wrapped> {
    if let Some(negative) = digits.strip_prefix('-') {
        if !negative.is_empty() && negative.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Wrapped);
        }
    }
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    Ok(digits.parse().ok())
}

/// Queue children of `marker`, in queue order.
pub(crate) fn sorted_queue(
    children: Vec<String>,
    marker: &str,
) -> std::result::Result<Vec<(u64, String)>, Wrapped> {
    let mut queue = Vec::with_capacity(children.len());
    for child in children {
        if let Some(seq) = sequence(&child, marker)? {
            queue.push((seq, child));
        }
    }
    queue.sort();
    Ok(queue)
}
/// The read and write nodes among `children`, in queue order, as
/// `(sequence, is_write, name)`; other children are not part of the queue.
pub(crate) fn rw_queue(
    children: Vec<String>,
) -> std::result::Result<Vec<(u64, bool, String)>, Wrapped> {
    let mut queue = Vec::with_capacity(children.len());
    for child in children {
        // Curator: a child containing `__WRIT__` is a writer.
        let parsed = match child.rsplit_once(WRITE) {
            Some((_, digits)) => Some((true, digits)),
            None => child.rsplit_once(READ).map(|(_, digits)| (false, digits)),
        };
        let Some((write, digits)) = parsed else {
            continue;
        };
        if let Some(seq) = sequence_digits(digits)? {
            queue.push((seq, write, child));
        }
    }
    queue.sort_unstable();
    Ok(queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_of_curator_kazoo_and_others() {
        let seq = |c: &str, m: &str| sequence(c, m).unwrap();
        assert_eq!(seq("_c_1f-lock-0000000042", "lock"), Some(42));
        assert_eq!(seq("abc__lock__0000000007", "lock"), Some(7));
        assert_eq!(seq("_c_1f-latch-0000000003", "latch"), Some(3));
        assert_eq!(seq("abc__lock__0000000007", "latch"), None);
        assert_eq!(seq("_unfair_lock", "lock"), None);
        assert_eq!(seq("_c_x-lock-12", "lock"), None);
        assert_eq!(seq("_c_x-lock-000000000a", "lock"), None);
        assert_eq!(seq("_c_x-lock-2147483647", "lock"), Some(2_147_483_647));
        let q = sorted_queue(
            vec![
                "b-lock-0000000010".into(),
                "a__lock__0000000002".into(),
                "junk".into(),
                "c-lock-0000000005".into(),
            ],
            "lock",
        )
        .unwrap();
        let names: Vec<&str> = q.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "a__lock__0000000002",
                "c-lock-0000000005",
                "b-lock-0000000010"
            ]
        );
    }

    #[test]
    fn a_sequence_past_i32_max_is_an_error_not_a_skipped_child() {
        // ZooKeeper prints the wrapped counter with "%010d".
        for child in [
            "_c_1f-lock--2147483648",
            "_c_1f-lock--000000001",
            "x__lock__-2147483647",
        ] {
            assert!(sequence(child, "lock").is_err(), "{child}");
        }
        assert!(sorted_queue(vec!["_c_1f-lock--2147483648".into()], "lock").is_err());
        assert_eq!(sequence("_c_1f-lock--", "lock").unwrap(), None);
    }

    #[test]
    fn every_layout_has_its_kind() {
        let fair = classify("_c_0f-lock-0000000007");
        assert_eq!(fair, Some((Kind::Fair, Some(7))));
        assert_eq!(classify("x__lock__0000000003"), Some((Kind::Fair, Some(3))));
        assert_eq!(
            classify("_c_0f-__READ__0000000001"),
            Some((Kind::Rw, Some(1)))
        );
        assert_eq!(
            classify("_c_0f-__WRIT__0000000002"),
            Some((Kind::Rw, Some(2)))
        );
        assert_eq!(
            classify("_c_0f-tag-latch-0000000009"),
            Some((Kind::Election, Some(9)))
        );
        assert_eq!(classify(UNFAIR_NODE), Some((Kind::Mutex, None)));
        assert_eq!(classify(LEASES), Some((Kind::Semaphore, None)));
        assert_eq!(classify(LOCKS), None);
        // A request to the unfair hold is of no kind, and in no queue.
        assert_eq!(classify(&unfair_request(42)), None);
        assert_eq!(
            sequence(&unfair_request(4_200_000_000), "lock").unwrap(),
            None
        );
        assert_eq!(classify("something-else"), None);
    }

    #[test]
    fn lease_data_round_trips_and_foreign_data_is_not_ours() {
        assert_eq!(lease_data(3, "w@h:1"), b"distlock permits=3 owner=w@h:1");
        assert_eq!(permits_of(&lease_data(7, "h:2")), Some(7));
        assert_eq!(permits_of(b"distlock permits=3"), Some(3));
        assert_eq!(permits_of(b"distlock owner=host:1 permits=2"), Some(2));
        assert_eq!(permits_of(b"distlock  permits=2 owner=x"), Some(2));
        // Curator's default node data: the client's IP address.
        assert_eq!(permits_of(b"127.0.1.1"), None);
        assert_eq!(permits_of(b""), None);
        assert_eq!(permits_of(b"distlock"), None);
        assert_eq!(permits_of(b"distlock permits=x"), None);
        assert_eq!(permits_of(b"distlockpermits=2"), None);
        assert_eq!(permits_of(&[0xff, 0xfe]), None);
    }

    #[test]
    fn latch_tags_round_trip_and_never_hold_a_dash_or_slash() {
        for owner in [
            "h:1",
            "web-1@h-2.example:42",
            "a/b_c.d:e@f%g",
            "x-latch-y@h:1",
        ] {
            let tag = latch_tag(owner);
            assert!(!tag.contains('-') && !tag.contains('/'), "{tag}");
            let child = format!("_c_0f1e2d3c-aaaa-bbbb-cccc-0123456789ab-{tag}-latch-0000000042");
            assert_eq!(latch_owner(&child).as_deref(), Some(owner), "{child}");
            assert_eq!(sequence(&child, "latch").ok().flatten(), Some(42));
        }
        // Curator's LeaderLatch nodes carry no owner.
        assert_eq!(
            latch_owner("_c_0f1e2d3c-aaaa-bbbb-cccc-0123456789ab-latch-0000000001"),
            None
        );
    }
}
