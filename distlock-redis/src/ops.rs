//! Operations: [`Provider::inspect`](distlock_core::Provider::inspect) and
//! [`Provider::force_release`](distlock_core::Provider::force_release) on
//! the plain Redis provider, one Lua script each (one round trip).
//!
//! The holder records the acquire scripts write next to the holds (see the
//! crate docs' key table) are read by `inspect_lock.lua` (mutex, fair mutex,
//! election) and `inspect_queued.lua` (read-write lock, semaphore); a hold
//! without a record of its own (its record belongs to another value of the
//! lock key, or there is none) is a foreign hold. The scripts compare the
//! lock key's value with the record inside Redis and never return it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use distlock_core::backend::with_timeout;
use distlock_core::{
    Error, ForceReleased, HoldRole, Holder, LeaderInfo, LeaseLeft, Name, PrimitiveKind, Result,
    Snapshot, Waiters,
};
use redis::{ScriptInvocation, Value};

use crate::context::Context;
use crate::keys::{Claim, Keys, Recipe};
use crate::scripts::{
    FORCE_LOCK, INSPECT_LOCK, INSPECT_QUEUED, REQUEST_RELEASE, RW_FORCE, SEM_FORCE,
};

/// What a foreign hold is shown as.
pub(crate) const FOREIGN: &str = "not distlock (redis-py or another client)";

/// The keys of `kind` of `name` (and its release channel).
enum KindKeys {
    /// Mutex, fair mutex and election: the lock family's keys.
    Lock(Keys),
    /// Read-write lock and semaphore: the queued family's recipe.
    Queued(Recipe),
}

fn keys_of(shared: &Arc<Context>, name: &Name, kind: PrimitiveKind) -> Result<KindKeys> {
    let prefix = &shared.options.prefix;
    Ok(match kind {
        PrimitiveKind::Mutex | PrimitiveKind::FairMutex => KindKeys::Lock(Keys::lock(prefix, name)),
        PrimitiveKind::Election => KindKeys::Lock(Keys::election(prefix, name)),
        PrimitiveKind::ReadWrite => {
            KindKeys::Queued(Recipe::new(prefix, name.clone(), Claim::Write))
        }
        PrimitiveKind::Semaphore => {
            KindKeys::Queued(Recipe::new(prefix, name.clone(), Claim::Permit(1)))
        }
        _ => {
            return Err(Error::Unsupported {
                backend: "redis",
                what: "operations on this primitive kind",
            })
        }
    })
}

impl KindKeys {
    /// The inspect script with its keys and the role or family argument.
    fn inspect_invocation(&self, kind: PrimitiveKind) -> ScriptInvocation<'static> {
        match self {
            KindKeys::Lock(keys) => {
                let mut invocation = INSPECT_LOCK.prepare_invoke();
                invocation
                    .key(&keys.lock)
                    .key(&keys.holder)
                    .key(&keys.queue)
                    .key(&keys.timeouts)
                    .key(&keys.owners)
                    .key(&keys.fence)
                    .key(&keys.revoke);
                if let Some(record) = &keys.record {
                    invocation.key(record);
                }
                invocation.arg(if kind == PrimitiveKind::Election {
                    "l"
                } else {
                    "x"
                });
                invocation
            }
            KindKeys::Queued(recipe) => {
                let mut invocation = INSPECT_QUEUED.prepare_invoke();
                for key in recipe.keys.in_order() {
                    invocation.key(key);
                }
                invocation.key(&recipe.revoke);
                invocation.arg(if kind == PrimitiveKind::Semaphore {
                    "sem"
                } else {
                    "rw"
                });
                invocation
            }
        }
    }

    /// The request-to-release script with its keys (`request_release.lua`).
    fn request_invocation(&self) -> ScriptInvocation<'static> {
        let mut invocation = REQUEST_RELEASE.prepare_invoke();
        match self {
            KindKeys::Lock(keys) => {
                invocation.key(&keys.lock).key(&keys.revoke).arg("lock");
            }
            KindKeys::Queued(recipe) => {
                invocation
                    .key(&recipe.keys.exclusive)
                    .key(&recipe.keys.holders)
                    .key(&recipe.revoke)
                    .arg(if matches!(recipe.claim, Claim::Permit(_)) {
                        "sem"
                    } else {
                        "rw"
                    });
            }
        }
        invocation
    }

    fn force_invocation(&self, fence_ttl_ms: u64) -> ScriptInvocation<'static> {
        match self {
            KindKeys::Lock(keys) => {
                let mut invocation = FORCE_LOCK.prepare_invoke();
                invocation
                    .key(&keys.lock)
                    .key(&keys.fence)
                    .key(&keys.queue)
                    .key(&keys.timeouts)
                    .key(&keys.holder)
                    .key(&keys.owners);
                if let Some(record) = &keys.record {
                    invocation.key(record);
                    if let Some(marker) = &keys.marker {
                        invocation.key(marker);
                    }
                }
                invocation.arg(&keys.channel).arg(fence_ttl_ms);
                invocation
            }
            KindKeys::Queued(recipe) => {
                let script = if matches!(recipe.claim, Claim::Permit(_)) {
                    &*SEM_FORCE
                } else {
                    &*RW_FORCE
                };
                let mut invocation = script.prepare_invoke();
                for key in recipe.keys.in_order() {
                    invocation.key(key);
                }
                invocation.key(&recipe.lock);
                invocation.arg(&recipe.channel).arg(fence_ttl_ms);
                invocation
            }
        }
    }

    /// The key at 1-based index `index` of the scripts' KEYS, and what it
    /// should hold.
    fn key_at(&self, index: i64) -> (String, &'static str) {
        let (key, expected) = match self {
            KindKeys::Lock(keys) => match index {
                1 => (&keys.lock, "lock (a string key)"),
                2 => (&keys.holder, "holder record (a hash)"),
                3 => (&keys.queue, "fair queue (a sorted set)"),
                4 => (&keys.timeouts, "fair queue deadlines (a sorted set)"),
                5 => (&keys.owners, "waiters' owners (a hash)"),
                7 => (&keys.revoke, "requests to release (a hash)"),
                _ => (
                    keys.record.as_ref().unwrap_or(&keys.lock),
                    "election leader record (a string key)",
                ),
            },
            KindKeys::Queued(recipe) => {
                if index == 8 {
                    return (recipe.revoke.clone(), "requests to release (a hash)");
                }
                let i = usize::try_from(index.clamp(1, 7) - 1).unwrap_or(0);
                let expected = match i {
                    0 if matches!(recipe.claim, Claim::Permit(_)) => "permits (a string key)",
                    0 => "writer (a string key)",
                    1 => "holders (a sorted set)",
                    2 => "queue (a sorted set)",
                    3 => "queue entries (a sorted set)",
                    4 => "fencing counter",
                    5 => "holder records (a hash)",
                    _ => "waiters' owners (a hash)",
                };
                (recipe.keys.in_order()[i], expected)
            }
        };
        (key.clone(), expected)
    }

    /// As [`KindKeys::key_at`] for the force-release scripts: for the lock
    /// family their key order differs (the fencing counter second).
    fn force_key_at(&self, index: i64) -> (String, &'static str) {
        match self {
            KindKeys::Lock(keys) => match index {
                2 => (keys.fence.clone(), "fencing counter"),
                3..=4 => self.key_at(index),
                5 => self.key_at(2),
                6 => self.key_at(5),
                7 => self.key_at(6),
                _ => self.key_at(1),
            },
            KindKeys::Queued(_) => self.key_at(index),
        }
    }

    fn fence_key(&self) -> &str {
        match self {
            KindKeys::Lock(keys) => &keys.fence,
            KindKeys::Queued(recipe) => &recipe.keys.fence,
        }
    }
}

pub(crate) fn conflict(what: &str, expected: &'static str) -> Error {
    Error::Conflict {
        what: format!("redis key {what:?}"),
        expected,
    }
}

pub(crate) fn bad_reply() -> Error {
    Error::server("redis", "inspect script returned an unknown reply")
}

pub(crate) fn text(value: &Value) -> Result<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).map_err(|_| bad_reply()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Okay => Ok("OK".to_owned()),
        Value::Nil => Ok(String::new()),
        _ => Err(bad_reply()),
    }
}

pub(crate) fn int(value: &Value) -> Result<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        _ => Err(bad_reply()),
    }
}

pub(crate) fn array(value: &Value) -> Result<&[Value]> {
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(bad_reply()),
    }
}

/// One holder: `{role, lease ms, own, owner, fence, at, asked}`.
fn holder(value: &Value) -> Result<Holder> {
    let [role, lease, own, owner, fence, at, asked] = array(value)? else {
        return Err(bad_reply());
    };
    let release_requested = int(asked)? == 1;
    let role = match text(role)?.as_str() {
        "x" => HoldRole::Exclusive,
        "l" => HoldRole::Leader,
        "w" => HoldRole::Write,
        "r" => HoldRole::Read,
        "p" => HoldRole::Permit,
        _ => return Err(bad_reply()),
    };
    let lease = match u64::try_from(int(lease)?) {
        Ok(ms) => LeaseLeft::Ttl(Duration::from_millis(ms)),
        Err(_) => LeaseLeft::NoExpiry,
    };
    if int(own)? != 1 {
        return Ok(Holder {
            role,
            owner: None,
            foreign: Some(FOREIGN.to_owned()),
            fencing_token: None,
            acquired_at: None,
            lease,
            release_requested,
        });
    }
    let owner = text(owner)?;
    let at = text(at)?.parse::<u64>().ok();
    Ok(Holder {
        role,
        owner: (!owner.is_empty()).then_some(owner),
        foreign: None,
        fencing_token: text(fence)?.parse::<u64>().ok(),
        acquired_at: at.map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        lease,
        release_requested,
    })
}

/// `error` with the type of the key it names when it is a [`Error::Conflict`]
/// on a Redis key: `redis key "x" (a list) is not a distlock lock (a string
/// key)` (the expected type alone read as the one found). One `TYPE`, on
/// this error path only; `error` as it was when the key cannot be read.
pub(crate) async fn with_key_type(shared: &Context, error: Error) -> Error {
    let Error::Conflict { what, expected } = &error else {
        return error;
    };
    let Some(key) = what
        .strip_prefix("redis key \"")
        .and_then(|k| k.strip_suffix('"'))
        .filter(|k| !k.contains('\\'))
    else {
        return error;
    };
    let timeout = shared.options.response_timeout;
    let Ok(conn) = shared.conn() else {
        return error;
    };
    let mut cmd = redis::cmd("TYPE");
    cmd.arg(key);
    let found = tokio::time::timeout(timeout, conn.query::<String>(timeout, &cmd)).await;
    let noun = match found {
        Ok(Ok(Ok(t))) => match t.as_str() {
            "string" => "a string key",
            "list" => "a list",
            "set" => "a set",
            "zset" => "a sorted set",
            "hash" => "a hash",
            "stream" => "a stream",
            _ => return error,
        },
        _ => return error,
    };
    Error::Conflict {
        what: format!("{what} ({noun})"),
        expected,
    }
}

/// Runs a script on the command connection within the response timeout.
async fn run(
    shared: &Context,
    operation: &'static str,
    invocation: &ScriptInvocation<'_>,
) -> Result<Value> {
    let timeout = shared.options.response_timeout;
    let conn = shared.conn()?.pin(timeout).await?;
    with_timeout(
        operation,
        timeout,
        conn.script(operation, timeout, invocation),
    )
    .await?
}

/// [`Provider::inspect`](distlock_core::Provider::inspect) on Redis.
pub(crate) async fn inspect(
    shared: &Arc<Context>,
    name: &str,
    kind: PrimitiveKind,
) -> Result<Snapshot> {
    shared.lifecycle.check_open()?;
    let name = Name::new(name)?;
    let keys = keys_of(shared, &name, kind)?;
    let reply = run(shared, "inspect", &keys.inspect_invocation(kind)).await?;
    let items = array(&reply)?;
    let status = items.first().map(int).transpose()?.ok_or_else(bad_reply)?;
    if status == -1 {
        let index = items.get(1).map(int).transpose()?.unwrap_or(1);
        let (key, expected) = keys.key_at(index);
        return Err(with_key_type(shared, conflict(&key, expected)).await);
    }
    let [_, holders, waiters, extra] = items else {
        return Err(bad_reply());
    };
    let mut snapshot = Snapshot::empty(name, kind, "redis");
    snapshot.holders = array(holders)?.iter().map(holder).collect::<Result<_>>()?;
    let waiting = array(waiters)?
        .iter()
        .map(text)
        .collect::<Result<Vec<_>>>()?;
    snapshot.waiters = Waiters {
        count: waiting.len(),
        owners: waiting.into_iter().filter(|o| !o.is_empty()).collect(),
    };
    let extra = text(extra)?;
    match kind {
        PrimitiveKind::Semaphore if !extra.is_empty() => {
            snapshot.permits = Some(extra.parse::<u32>().map_err(|_| {
                let (key, expected) = keys.key_at(1);
                conflict(&key, expected)
            })?);
        }
        PrimitiveKind::Election if !extra.is_empty() => {
            let leader = extra
                .split_once(' ')
                .and_then(|(term, id)| {
                    Some(LeaderInfo {
                        term: term.parse().ok()?,
                        id: id.to_owned(),
                    })
                })
                .ok_or_else(|| {
                    let (key, _) = keys.key_at(6);
                    conflict(&key, "election leader record (\"<term> <candidate>\")")
                })?;
            snapshot.leader = Some(leader);
        }
        _ => {}
    }
    Ok(snapshot)
}

/// [`Provider::request_release`](distlock_core::Provider::request_release)
/// on Redis: marks the holds (`request_release.lua`), then reads them back
/// as `inspect` does (two round trips; an operator's call).
pub(crate) async fn request_release(
    shared: &Arc<Context>,
    name: &str,
    kind: PrimitiveKind,
) -> Result<Vec<Holder>> {
    shared.lifecycle.check_open()?;
    let checked = Name::new(name)?;
    let keys = keys_of(shared, &checked, kind)?;
    let marked = int(&run(shared, "request_release", &keys.request_invocation()).await?)?;
    let snapshot = inspect(shared, name, kind).await?;
    tracing::info!(name = %checked, kind = %kind, marked, owner = %shared.owner, "distlock redis request to release");
    Ok(snapshot
        .holders
        .into_iter()
        .filter(|h| h.release_requested)
        .collect())
}

/// [`Provider::force_release`](distlock_core::Provider::force_release) on
/// Redis.
pub(crate) async fn force_release(
    shared: &Arc<Context>,
    name: &str,
    kind: PrimitiveKind,
) -> Result<ForceReleased> {
    shared.lifecycle.check_open()?;
    let name = Name::new(name)?;
    let keys = keys_of(shared, &name, kind)?;
    let retention = shared.options.fence_retention_ms();
    let reply = run(shared, "force_release", &keys.force_invocation(retention)).await?;
    let items = array(&reply)?;
    let [status, value] = items else {
        return Err(bad_reply());
    };
    let (status, value) = (int(status)?, int(value)?);
    match status {
        -1 => {
            let (key, expected) = keys.force_key_at(value);
            Err(with_key_type(shared, conflict(&key, expected)).await)
        }
        -2 => Err(conflict(keys.fence_key(), "fencing counter")),
        -3 => Err(Error::Exhausted {
            name: keys.fence_key().to_owned(),
        }),
        evicted if evicted >= 0 => {
            // 0: nothing was held, and the script changed nothing.
            let fence = u64::try_from(value).map_err(|_| bad_reply())?;
            let evicted = usize::try_from(evicted).map_err(|_| bad_reply())?;
            tracing::warn!(
                name = %name,
                kind = %kind,
                evicted,
                fence,
                owner = %shared.owner,
                "distlock redis force-release"
            );
            Ok(ForceReleased {
                evicted,
                fence: (fence > 0).then_some(fence),
            })
        }
        _ => Err(bad_reply()),
    }
}
