//! The keys of every family, all in the lock key's Cluster slot, and each
//! script's KEYS (and the arguments that name keys) in their order.

use std::time::Duration;

use distlock_core::{Error, Name};
use redis::{Script, ScriptInvocation};

use crate::scripts::{
    EXTEND, LINE_ALIVE, MUTEX_PASS, MUTEX_RELEASE, RELEASE, RW_ACQUIRE, RW_EXTEND, RW_RELEASE,
    SEM_ACQUIRE, SEM_EXTEND, SEM_RELEASE,
};

/// How long a release reserves the free lock for the provider it woke: long
/// enough for the woken waiter to ask (a loopback round trip is ~0.1 ms; a
/// busy machine may take milliseconds to schedule it), short enough that a
/// provider that died in between costs little.
pub(crate) const RESERVATION: Duration = Duration::from_millis(50);

/// How many hand-overs in a row a contended plain mutex makes before a
/// release leaves it free as a turn for clients outside the line
/// (`mutex_release.lua`), while none of them takes its turns.
pub(crate) const TURN_AFTER_UNSEEN: u32 = 64;

/// How many, once such a client took a turn or was found holding the lock:
/// few, so that it keeps getting turns, and the lock passes between the two
/// about every fourth acquisition. Each turn nobody takes doubles
/// it, up to [`TURN_AFTER_UNSEEN`].
pub(crate) const TURN_AFTER: u32 = 3;

/// The streak key's value is its count of hand-overs plus this times the
/// hand-overs due before the next turn (`mutex_release.lua`).
pub(crate) const STREAK_UNIT: u32 = 1024;

/// How long this version's waiters hold back when a release left the lock
/// free as a turn: long enough for a client that polls every millisecond
/// (redis-py) to ask on a busy machine, short enough that a turn nobody
/// takes costs little (the lock sits free that long, at most).
pub(crate) const TURN: Duration = Duration::from_millis(3);

/// The keys of one lock: all in the lock key's Cluster slot.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    /// prefix + name, exactly (what redis-py's `Lock(name)` uses).
    pub(crate) lock: String,
    /// `{lock}:fence`, the fencing counter.
    pub(crate) fence: String,
    /// `{lock}:released`, the release channel.
    pub(crate) channel: String,
    /// `{lock}:fair:queue`, the fair waiters (zset id -> arrival number).
    pub(crate) queue: String,
    /// `{lock}:fair:timeouts`, their entries' expiry (zset id -> server ms).
    pub(crate) timeouts: String,
    /// `{lock}:holder`, the holder record (hash: `lock` = the lock key's
    /// value, `fence`, `at` = acquired at in server ms, `owner`), with the
    /// lock key's TTL.
    pub(crate) holder: String,
    /// `{lock}:fair:owners`, the fair waiters' owner identities (hash id ->
    /// owner), expiring with the queue.
    pub(crate) owners: String,
    /// A key that lives and dies with the lock (an election's leader
    /// record): set by the acquire, extended and deleted with the lock.
    pub(crate) record: Option<String>,
    /// The mutex's lock key of an election's name (prefix + name): checked
    /// for other kinds, and holding the election's marker while it has a
    /// leader (`kind.lua`); `None` for the mutex's own keys.
    pub(crate) marker: Option<String>,
    /// The plain mutex's line; `None` for the other users of these keys.
    pub(crate) line: Option<LineKeys>,
    /// `{lock}:revoke`, the requests to release (hash: the hold's lock key
    /// value -> 1), read by the holder's renewals (`request_release.lua`).
    pub(crate) revoke: String,
}

impl Keys {
    /// The keys of the lock `prefix + name` that the plain and the fair
    /// mutex share (the lock key, its fence, channel, fair queue and holder
    /// record), without the plain mutex's line.
    pub(crate) fn lock(prefix: &str, name: &Name) -> Keys {
        Keys::from_lock(format!("{prefix}{name}"))
    }

    /// The keys of the lock key `lock` (prefix + name).
    fn from_lock(lock: String) -> Keys {
        Keys {
            fence: format!("{{{lock}}}:fence"),
            channel: format!("{{{lock}}}:released"),
            queue: format!("{{{lock}}}:fair:queue"),
            timeouts: format!("{{{lock}}}:fair:timeouts"),
            holder: format!("{{{lock}}}:holder"),
            owners: format!("{{{lock}}}:fair:owners"),
            revoke: format!("{{{lock}}}:revoke"),
            record: None,
            marker: None,
            line: None,
            lock,
        }
    }

    /// The plain mutex's keys: [`Keys::lock`]'s and its line.
    pub(crate) fn plain_mutex(prefix: &str, name: &Name) -> Keys {
        let mut keys = Keys::lock(prefix, name);
        keys.line = Some(line_keys(&keys.lock));
        keys
    }

    /// The plain mutex's keys of the lock whose release channel is
    /// `channel` (`{lock}:released`).
    pub(crate) fn of_channel(channel: &str) -> Option<Keys> {
        let lock = channel.strip_prefix('{')?.strip_suffix("}:released")?;
        let mut keys = Keys::from_lock(lock.to_owned());
        keys.line = Some(line_keys(lock));
        Some(keys)
    }

    /// The script a provider runs when it leaves this lock's line (see
    /// `mutex_pass.lua`); `None` without a line.
    pub(crate) fn pass<'a>(&'a self, provider: &'a str) -> Option<redis::ScriptInvocation<'a>> {
        let LineKeys {
            waiting,
            handoff,
            alive,
            listening,
            ..
        } = self.line.as_ref()?;
        let mut invocation = MUTEX_PASS.key(&self.lock);
        invocation
            .key(waiting)
            .key(handoff)
            .key(alive)
            .key(listening)
            .arg(provider)
            .arg(&self.channel)
            .arg(RESERVATION.as_millis().to_string());
        Some(invocation)
    }

    /// The script that keeps `provider`'s place in this lock's line alive
    /// for `alive` more (see `line_alive.lua`); `None` without a line.
    pub(crate) fn keep_alive<'a>(
        &'a self,
        provider: &'a str,
        alive: Duration,
    ) -> Option<redis::ScriptInvocation<'a>> {
        let LineKeys {
            waiting,
            alive: deadlines,
            ..
        } = self.line.as_ref()?;
        let mut invocation = LINE_ALIVE.key(waiting);
        invocation
            .key(deadlines)
            .arg(provider)
            .arg(alive.as_millis().to_string());
        Some(invocation)
    }

    /// An election's keys: its own lease key, counter, queue and channel,
    /// in the same slot as the mutex of the same name but apart from it.
    pub(crate) fn election(prefix: &str, name: &Name) -> Keys {
        let base = format!("{{{prefix}{name}}}:elect");
        Keys {
            fence: format!("{base}:fence"),
            channel: format!("{base}:events"),
            queue: format!("{base}:queue"),
            timeouts: format!("{base}:timeouts"),
            holder: format!("{base}:holder"),
            owners: format!("{base}:owners"),
            revoke: format!("{base}:revoke"),
            record: Some(format!("{base}:leader")),
            marker: Some(format!("{prefix}{name}")),
            line: None,
            lock: base,
        }
    }

    /// The extend script with its keys: renews the hold of `token` for
    /// `ms`, and the fencing counter for `fence_ms`; answers 3 when the
    /// hold was asked to release.
    pub(crate) fn extend<'a>(
        &'a self,
        token: &'a str,
        ms: u64,
        fence_ms: u64,
    ) -> ScriptInvocation<'a> {
        let mut invocation = EXTEND.key(&self.lock);
        invocation.key(&self.fence).key(&self.revoke);
        if let Some(record) = &self.record {
            invocation.key(record);
            if let Some(marker) = &self.marker {
                invocation.key(marker);
            }
        }
        invocation.arg(token).arg(ms).arg(fence_ms);
        invocation
    }

    /// The release script with its keys (the hand-over reads the queue).
    pub(crate) fn release<'a>(&'a self, token: &'a str) -> redis::ScriptInvocation<'a> {
        if let Some(LineKeys {
            waiting,
            handoff,
            alive,
            listening,
            streak,
        }) = &self.line
        {
            let mut invocation = MUTEX_RELEASE.key(&self.lock);
            invocation
                .key(&self.queue)
                .key(&self.timeouts)
                .key(&self.holder)
                .key(&self.owners)
                .key(waiting)
                .key(handoff)
                .key(alive)
                .key(listening)
                .key(streak)
                .arg(token)
                .arg(&self.channel)
                .arg(RESERVATION.as_millis().to_string())
                .arg(TURN_AFTER_UNSEEN)
                .arg(TURN.as_millis().to_string());
            return invocation;
        }
        let mut invocation = RELEASE.key(&self.lock);
        invocation
            .key(&self.queue)
            .key(&self.timeouts)
            .key(&self.holder)
            .key(&self.owners);
        if let Some(record) = &self.record {
            invocation.key(record);
            if let Some(marker) = &self.marker {
                invocation.key(marker);
            }
        }
        invocation.arg(token).arg(&self.channel);
        invocation
    }
}

/// The plain mutex's line of waiting providers.
#[derive(Clone, Debug)]
pub(crate) struct LineKeys {
    /// `{lock}:waiting`: the waiting providers' ids (zset, in arrival
    /// order).
    pub(crate) waiting: String,
    /// `{lock}:handoff`: the provider a release reserved the lock for.
    pub(crate) handoff: String,
    /// `{lock}:waiting:alive`: the waiting providers' liveness deadlines
    /// (zset id -> server ms).
    pub(crate) alive: String,
    /// `{lock}:listening`: the providers whose plain waiters listen for
    /// the release but could not join the line (zset id -> server ms, with
    /// a TTL), so that a release publishes even with nobody in line (see
    /// `acquire.lua`).
    pub(crate) listening: String,
    /// `{lock}:streak`: the hand-overs in a row since the lock was last
    /// left free to everyone (an integer, expiring after a minute; see
    /// `mutex_release.lua`).
    pub(crate) streak: String,
}

/// The line keys of the lock key `lock`.
fn line_keys(lock: &str) -> LineKeys {
    LineKeys {
        waiting: format!("{{{lock}}}:waiting"),
        handoff: format!("{{{lock}}}:handoff"),
        alive: format!("{{{lock}}}:waiting:alive"),
        listening: format!("{{{lock}}}:listening"),
        streak: format!("{{{lock}}}:streak"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_lock_keys_slot_and_lock_key_is_prefix_plus_name() {
        let k = Keys::lock("app:", &Name::new("orders/42").unwrap());
        assert_eq!(k.lock, "app:orders/42");
        assert_eq!(k.fence, "{app:orders/42}:fence");
        assert_eq!(k.channel, "{app:orders/42}:released");
        assert_eq!(slot(&k.lock), slot(&k.fence));
        assert_eq!(slot(&k.lock), slot(&k.channel));
        // The reference value of the Redis Cluster spec: "123456789" -> 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn fair_and_election_keys_share_the_slot_and_stay_apart() {
        let name = Name::new("orders/42").unwrap();
        let k = Keys::lock("app:", &name);
        assert_eq!(k.queue, "{app:orders/42}:fair:queue");
        assert_eq!(k.timeouts, "{app:orders/42}:fair:timeouts");
        assert_eq!(k.record, None);
        let e = Keys::election("app:", &name);
        assert_eq!(e.lock, "{app:orders/42}:elect");
        assert_eq!(e.record.as_deref(), Some("{app:orders/42}:elect:leader"));
        let slot_of = slot(&k.lock);
        for key in [
            &k.queue,
            &k.timeouts,
            &e.lock,
            &e.fence,
            &e.channel,
            &e.queue,
            &e.timeouts,
        ] {
            assert_eq!(slot(key), slot_of, "{key}");
        }
        for (mine, theirs) in [
            (&e.lock, &k.lock),
            (&e.fence, &k.fence),
            (&e.channel, &k.channel),
        ] {
            assert_ne!(mine, theirs);
        }
    }

    /// Every key of every family of a name but its lock key (prefix +
    /// name): the mutex's and fair mutex's, the election's (its lease key
    /// too), the read-write lock's and semaphore's, the id generator's and
    /// Redlock's. The lists are exhaustive: a new field does not compile
    /// until it is listed here.
    fn internal_keys(prefix: &str, name: &Name) -> Vec<String> {
        let mut internal = Vec::new();
        for keys in [
            Keys::plain_mutex(prefix, name),
            Keys::election(prefix, name),
        ] {
            let Keys {
                lock,
                fence,
                channel,
                queue,
                timeouts,
                holder,
                owners,
                record,
                marker,
                line,
                revoke,
            } = keys;
            internal.extend([fence, channel, queue, timeouts, holder, owners, revoke]);
            internal.extend(record);
            if let Some(LineKeys {
                waiting,
                handoff,
                alive,
                listening,
                streak,
            }) = line
            {
                internal.extend([waiting, handoff, alive, listening, streak]);
            }
            if marker.is_some() {
                // An election's lease key; its marker is the lock key.
                internal.push(lock);
            }
        }
        for claim in [Claim::Read, Claim::Write, Claim::Permit(3)] {
            let Recipe {
                name: _,
                keys:
                    QueuedKeys {
                        exclusive,
                        holders,
                        queue,
                        alive,
                        fence,
                        info,
                        owners,
                    },
                lock: _,
                channel,
                claim: _,
                mode: _,
                revoke,
            } = Recipe::new(prefix, name.clone(), claim);
            internal.extend([
                exclusive, holders, queue, alive, fence, info, owners, channel, revoke,
            ]);
        }
        // The id generator's counter and Redlock's (built where they are
        // used: `redlock::mutex::RedlockKeys`).
        internal.push(format!("{{{prefix}{name}}}:ids"));
        internal.push(format!("{{{prefix}{name}}}:redlock:fence"));
        internal
    }

    /// No key of a lock's internals can be named by a fenced write: the
    /// resource rule refuses each of them, while the lock key itself, the
    /// user's name, stays an ordinary name.
    #[test]
    fn a_fenced_write_names_no_key_of_a_lock() {
        use distlock_core::fence::check_resource;
        let name = Name::new("orders/42").unwrap();
        for prefix in ["", "app:", "{app}:"] {
            assert!(check_resource(&Keys::lock(prefix, &name).lock).is_ok());
            for key in internal_keys(prefix, &name) {
                assert!(
                    check_resource(&key).is_err_and(|e| e.is_invalid_input()),
                    "{key}"
                );
            }
        }
    }

    /// No name's lock key is another name's internal key, whatever the
    /// prefix: an internal key has two braces more than the prefix (the
    /// hash tag around prefix + name), and a name has none. So a name that
    /// looks like another's suffix (`x:fence`, `x:elect`) is a lock of its
    /// own; the Redis layout keeps names apart by itself.
    #[test]
    fn no_name_is_another_names_internal_key() {
        for prefix in ["", "app:", "{app}:", "a}b{"] {
            for name in ["x", "orders/42", "x:fence", "_unfair_lock"] {
                let name = Name::new(name).unwrap();
                let lock = Keys::lock(prefix, &name).lock;
                for key in internal_keys(prefix, &name) {
                    assert_ne!(key, lock);
                    let braces = |s: &str| s.matches(['{', '}']).count();
                    assert_eq!(braces(&key), braces(prefix) + 2, "{key}");
                    // So no valid name makes it a lock key.
                    if let Some(rest) = key.strip_prefix(prefix) {
                        assert!(Name::new(rest).is_err(), "{key}");
                    }
                }
            }
        }
    }

    /// CRC16/XMODEM as Redis Cluster computes it.
    fn crc16(data: &[u8]) -> u16 {
        let mut crc: u16 = 0;
        for byte in data {
            crc ^= u16::from(*byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    /// The key's slot, honouring a `{hash tag}`.
    fn slot(key: &str) -> u16 {
        let hashed = key
            .find('{')
            .and_then(|open| {
                let close = key[open + 1..].find('}')? + open + 1;
                (close > open + 1).then(|| &key[open + 1..close])
            })
            .unwrap_or(key);
        crc16(hashed.as_bytes()) % 16384
    }
}

/// What a queued acquisition claims (a side of a read-write lock, or a
/// semaphore's permit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// A read share of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
    /// One permit of a semaphore of this many.
    Permit(u32),
}

/// The keys of a queued recipe (a read-write lock, a semaphore), in the
/// order of KEYS[1..=7] of every script of the family.
pub(crate) struct QueuedKeys {
    /// The exclusive key: the writer (read-write lock) or the number of
    /// permits (semaphore).
    pub(crate) exclusive: String,
    /// The holders (zset token -> expiry in server ms).
    pub(crate) holders: String,
    /// The waiters in arrival order (zset).
    pub(crate) queue: String,
    /// The queue entries' expiries (zset).
    pub(crate) alive: String,
    /// The fencing counter.
    pub(crate) fence: String,
    /// The holder records (hash).
    pub(crate) info: String,
    /// The waiters' owner identities (hash).
    pub(crate) owners: String,
}

impl QueuedKeys {
    /// The keys in KEYS order.
    pub(crate) fn in_order(&self) -> [&String; 7] {
        [
            &self.exclusive,
            &self.holders,
            &self.queue,
            &self.alive,
            &self.fence,
            &self.info,
            &self.owners,
        ]
    }
}

/// One primitive's keys, channel and scripts.
pub(crate) struct Recipe {
    pub(crate) name: Name,
    /// KEYS[1..=7] of every script of the family.
    pub(crate) keys: QueuedKeys,
    /// KEYS\[8\] of the acquire, release, extend and force scripts: the
    /// mutex's lock key of the name (prefix + name), checked for other kinds
    /// and holding this kind's marker while it has holders (`kind.lua`).
    pub(crate) lock: String,
    pub(crate) channel: String,
    pub(crate) claim: Claim,
    /// The script argument after the channel: `r`, `w` or the number of
    /// permits.
    pub(crate) mode: String,
    /// `{lock}:rw:revoke` / `{lock}:sem:revoke`, the requests to release
    /// (hash: token -> 1), KEYS\[9\] of the extend scripts.
    pub(crate) revoke: String,
}

impl Recipe {
    /// The recipe of `side` of `name`: `{lock}:rw:…` keys for a read-write
    /// lock's sides, `{lock}:sem:…` for a semaphore.
    pub(crate) fn new(prefix: &str, name: Name, claim: Claim) -> Recipe {
        let lock = Keys::lock(prefix, &name).lock;
        let kind = if matches!(claim, Claim::Permit(_)) {
            "sem"
        } else {
            "rw"
        };
        let key = |suffix: &str| format!("{{{lock}}}:{kind}:{suffix}");
        let first = if kind == "sem" { "permits" } else { "writer" };
        let channel = key("released");
        let revoke = key("revoke");
        Recipe {
            name,
            keys: QueuedKeys {
                exclusive: key(first),
                holders: key(if kind == "sem" { "holders" } else { "readers" }),
                queue: key("queue"),
                alive: key("alive"),
                fence: key("fence"),
                info: key("info"),
                owners: key("owners"),
            },
            lock,
            channel,
            claim,
            mode: match claim {
                Claim::Read => "r".to_owned(),
                Claim::Write => "w".to_owned(),
                Claim::Permit(n) => n.to_string(),
            },
            revoke,
        }
    }

    pub(crate) fn scripts(&self) -> [&'static Script; 3] {
        match self.claim {
            Claim::Permit(_) => [&*SEM_ACQUIRE, &*SEM_RELEASE, &*SEM_EXTEND],
            Claim::Read | Claim::Write => [&*RW_ACQUIRE, &*RW_RELEASE, &*RW_EXTEND],
        }
    }

    pub(crate) fn invocation(&self, script: &'static Script) -> ScriptInvocation<'static> {
        let mut invocation = script.prepare_invoke();
        for key in self.keys.in_order() {
            invocation.key(key);
        }
        invocation.key(&self.lock);
        invocation
    }

    /// The release script: releases the hold of `token` (none if empty)
    /// and takes `member` (none if empty) out of the queue.
    pub(crate) fn release(&self, token: &str, member: &str) -> ScriptInvocation<'static> {
        let mut invocation = self.invocation(self.scripts()[1]);
        invocation
            .arg(token)
            .arg(member)
            .arg(&self.channel)
            .arg(&self.mode);
        invocation
    }

    /// The extend script: renews the hold of `token` for `ms`, and the
    /// fencing counter for `fence_ms`; answers 3 when the hold was asked to
    /// release.
    pub(crate) fn extend(&self, token: &str, ms: u64, fence_ms: u64) -> ScriptInvocation<'static> {
        let mut invocation = self.invocation(self.scripts()[2]);
        invocation
            .key(&self.revoke)
            .arg(token)
            .arg(ms)
            .arg(&self.mode)
            .arg(fence_ms);
        invocation
    }

    pub(crate) fn member_prefix(&self) -> &'static str {
        match self.claim {
            Claim::Read => "r:",
            Claim::Write => "w:",
            Claim::Permit(_) => "",
        }
    }

    pub(crate) fn conflict(&self, index: i64) -> Error {
        let (key, expected) = match index {
            1 if matches!(self.claim, Claim::Permit(_)) => {
                (&self.keys.exclusive, "permits (a string key)")
            }
            1 => (&self.keys.exclusive, "writer (a string key)"),
            2 => (&self.keys.holders, "holders (a sorted set)"),
            3 => (&self.keys.queue, "queue (a sorted set)"),
            4 => (&self.keys.alive, "queue entries (a sorted set)"),
            6 => (&self.keys.info, "holder records (a hash)"),
            7 => (&self.keys.owners, "waiters' owners (a hash)"),
            _ => (&self.keys.fence, "fencing counter"),
        };
        Error::Conflict {
            what: format!("redis key {key:?}"),
            expected,
        }
    }
}
