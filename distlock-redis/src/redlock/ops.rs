//! Operations on a Redlock: [`Provider::inspect`](distlock_core::Provider::inspect)
//! and [`Provider::force_release`](distlock_core::Provider::force_release),
//! one script per master, all masters in parallel.
//!
//! A Redlock is held by the value that a quorum of masters hold. Each
//! master's `redlock_inspect.lua` returns the SHA1 of its lock key's value
//! (never the value), its PTTL, its holder record when it belongs to that
//! value, and its fencing counter; the client groups the masters by value.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime};

use distlock_core::{
    Error, ForceReleased, HoldRole, Holder, LeaseLeft, Name, PrimitiveKind, Result, Snapshot,
};
use redis::{Cmd, Script, Value};

use super::mutex::{evalsha, RedlockKeys};
use super::{Shared, BACKEND};
use crate::ops::{array, bad_reply, conflict, int, text, FOREIGN};
use crate::scripts::{FORCE_LOCK, REDLOCK_INSPECT};

/// One master's part of a Redlock, as inspected.
struct Part {
    /// SHA1 of the lock key's value; empty when the key is absent.
    id: String,
    /// The key's PTTL in ms (negative: no TTL).
    pttl: i64,
    /// The holder record, when it belongs to the value: owner, fence, at.
    record: Option<(String, Option<u64>, Option<u64>)>,
}

fn check_kind(kind: PrimitiveKind) -> Result<()> {
    if kind == PrimitiveKind::Mutex {
        return Ok(());
    }
    Err(Error::Unsupported {
        backend: BACKEND,
        what: "operations on anything but the mutex (Redlock offers only the mutex)",
    })
}

/// Runs `cmd` (an `EVALSHA` of `script`) on every master at once, each
/// within the response timeout; one result per master, in order.
async fn on_all(
    shared: &Shared,
    operation: &'static str,
    script: &Script,
    cmd: &Cmd,
) -> Vec<Result<Value>> {
    let timeout = shared.options.response_timeout;
    let once = AtomicBool::new(false);
    futures::future::join_all(shared.masters.iter().map(|m| async {
        distlock_core::backend::with_timeout(
            operation,
            timeout,
            m.eval::<Value>(operation, timeout, script, cmd, &once),
        )
        .await
        .and_then(|r| r)
    }))
    .await
}

/// The answers of `results`, and their first error; that error when fewer
/// than a quorum answered.
fn quorum_answered(
    shared: &Shared,
    results: Vec<Result<Value>>,
) -> Result<(Vec<Value>, Option<Error>)> {
    let (mut answers, mut first_error) = (Vec::new(), None);
    for result in results {
        match result {
            Ok(value) => answers.push(value),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if answers.len() >= shared.quorum {
        return Ok((answers, first_error));
    }
    Err(first_error.unwrap_or_else(bad_reply))
}

fn part(keys: &RedlockKeys, value: &Value) -> Result<Part> {
    let items = array(value)?;
    if let [code, index] = items {
        if int(code)? == -1 {
            return Err(match int(index)? {
                1 => conflict(&keys.lock, "lock (a string key)"),
                2 => conflict(&keys.holder, "holder record (a hash)"),
                _ => conflict(&keys.fence, "fencing counter (a string)"),
            });
        }
        return Err(bad_reply());
    }
    let [id, pttl, own, owner, fence, at, _counter] = items else {
        return Err(bad_reply());
    };
    let record = (int(own)? == 1).then(|| -> Result<_> {
        Ok((
            text(owner)?,
            text(fence)?.parse::<u64>().ok(),
            text(at)?.parse::<u64>().ok(),
        ))
    });
    Ok(Part {
        id: text(id)?,
        pttl: int(pttl)?,
        record: record.transpose()?,
    })
}

/// The Redlock's state: the value a quorum of the masters that answered
/// hold is the holder.
pub(super) async fn inspect(shared: &Shared, name: &Name, kind: PrimitiveKind) -> Result<Snapshot> {
    check_kind(kind)?;
    shared.lifecycle.check_open()?;
    let keys = RedlockKeys::new(&shared.options.prefix, name);
    let cmd = evalsha(&REDLOCK_INSPECT, &[&keys.lock, &keys.holder, &keys.fence]);
    let results = on_all(shared, "inspect", &REDLOCK_INSPECT, &cmd).await;
    let (answers, first_error) = quorum_answered(shared, results)?;
    let mut parts = Vec::new();
    for value in &answers {
        parts.push(part(&keys, value)?);
    }
    let mut groups: HashMap<&str, Vec<&Part>> = HashMap::new();
    for p in parts.iter().filter(|p| !p.id.is_empty()) {
        groups.entry(p.id.as_str()).or_default().push(p);
    }
    let unanswered = shared.masters.len() - parts.len();
    let mut snapshot = Snapshot::empty(name.clone(), kind, BACKEND);
    let Some(group) = groups.into_values().max_by_key(Vec::len) else {
        return Ok(snapshot);
    };
    if group.len() < shared.quorum {
        if group.len() + unanswered >= shared.quorum {
            // The masters that did not answer decide it.
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        // A minority's keys: leftovers of a failed or expired attempt.
        return Ok(snapshot);
    }
    // Held while a quorum of the keys live: the quorum-th longest PTTL.
    let mut left: Vec<i64> = group.iter().map(|p| p.pttl).collect();
    left.sort_unstable_by(|a, b| b.cmp(a));
    let lease = match u64::try_from(left[shared.quorum - 1]) {
        Ok(ms) => LeaseLeft::Ttl(Duration::from_millis(ms)),
        Err(_) => LeaseLeft::NoExpiry,
    };
    let records: Vec<_> = group.iter().filter_map(|p| p.record.as_ref()).collect();
    snapshot.holders.push(if records.is_empty() {
        Holder {
            role: HoldRole::Exclusive,
            owner: None,
            foreign: Some(FOREIGN.to_owned()),
            fencing_token: None,
            acquired_at: None,
            lease,
            release_requested: false,
        }
    } else {
        let owner = records.iter().map(|r| r.0.as_str()).find(|o| !o.is_empty());
        Holder {
            role: HoldRole::Exclusive,
            owner: owner.map(str::to_owned),
            foreign: None,
            // The guard's token is the largest of the masters' counters
            // that took it (written back to the others).
            fencing_token: records.iter().filter_map(|r| r.1).max(),
            acquired_at: records
                .iter()
                .filter_map(|r| r.2)
                .min()
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
            lease,
            release_requested: false,
        }
    });
    Ok(snapshot)
}

/// Deletes the lock key on every master (whatever its value), advances
/// every master's fencing counter and publishes a release on each.
pub(super) async fn force_release(
    shared: &Shared,
    name: &Name,
    kind: PrimitiveKind,
) -> Result<ForceReleased> {
    check_kind(kind)?;
    shared.lifecycle.check_open()?;
    let keys = RedlockKeys::new(&shared.options.prefix, name);
    let mut cmd = evalsha(
        &FORCE_LOCK,
        &[
            &keys.lock,
            &keys.fence,
            &keys.queue,
            &keys.timeouts,
            &keys.holder,
            &keys.owners,
        ],
    );
    cmd.arg(&keys.channel)
        .arg(shared.options.fence_retention_ms());
    let results = on_all(shared, "force release", &FORCE_LOCK, &cmd).await;
    let (answers, _) = quorum_answered(shared, results)?;
    let (mut deleted, mut counters) = (0, Vec::new());
    for value in &answers {
        let [code, token] = array(value)? else {
            return Err(bad_reply());
        };
        match int(code)? {
            -1 => {
                return Err(match int(token)? {
                    1 => conflict(&keys.lock, "lock (a string key)"),
                    2 => conflict(&keys.fence, "fencing counter (a string)"),
                    5 => conflict(&keys.holder, "holder record (a hash)"),
                    _ => conflict(&keys.queue, "an absent key (Redlock keeps no queue)"),
                })
            }
            -2 => return Err(conflict(&keys.fence, "fencing counter (an integer)")),
            -3 => {
                return Err(Error::Exhausted {
                    name: keys.fence.clone(),
                })
            }
            n => {
                deleted += usize::from(n == 1);
                counters.push(u64::try_from(int(token)?).map_err(|_| bad_reply())?);
            }
        }
    }
    let n = shared.masters.len();
    let unanswered = n - counters.len();
    // A master that did not answer counts as a counter of 0. Any quorum
    // holds one of the n - quorum + 1 largest counters, so the next token,
    // above that quorum's largest, is above the (n - quorum + 1)-th largest.
    counters.resize(n, 0);
    counters.sort_unstable_by(|a, b| b.cmp(a));
    let fence = counters[n - shared.quorum];
    Ok(ForceReleased {
        // A hold lived on a quorum; what was deleted (with the masters that
        // did not answer) could have been one.
        evicted: usize::from(deleted > 0 && deleted + unanswered >= shared.quorum),
        fence: Some(fence),
    })
}
