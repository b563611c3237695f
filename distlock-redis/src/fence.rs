//! Fenced writes to Redis keys: each a Lua script that checks the token
//! and writes in one step (the rule of [`distlock_core::fence`]).

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use distlock_core::backend::with_timeout;
use distlock_core::fence::{check_resource, Fence, FenceToken, Highest};
use distlock_core::{Error, Result};
use redis::{FromRedisValue, RedisError, Script, ScriptInvocation, ToRedisArgs, Value};

use crate::context::Context;
use crate::provider::RedisProvider;

const RULE: &str = include_str!("scripts/guarded_rule.lua");

static SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guarded_rule.lua"),
        include_str!("scripts/guarded_set.lua")
    ))
});
static HSET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guarded_rule.lua"),
        include_str!("scripts/guarded_hset.lua")
    ))
});
static DEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guarded_rule.lua"),
        include_str!("scripts/guarded_del.lua")
    ))
});
static INCR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guarded_rule.lua"),
        include_str!("scripts/guarded_incr.lua")
    ))
});
static ADMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guarded_rule.lua"),
        include_str!("scripts/guarded_admit.lua")
    ))
});

/// Where a user's body goes in `guarded_script.lua`.
const BODY_MARKER: &str = "-- distlock: the user's body\n";

/// Fenced writes to Redis keys, over a [`RedisProvider`]'s connection
/// (single, pool, Cluster or Sentinel, with its response timeout): see
/// [`distlock_core::fence`] for the rule, and [the crate
/// docs](crate#fencing-redis-keys) for an example.
///
/// Every write is one script that reads the key's fence, refuses a stale
/// token with [`Error::Stale`] (nothing written), writes, and records the
/// token: atomic, as every Redis script is. Keys are the caller's own,
/// exactly as given (the provider's prefix is not applied); each key's
/// fence is the hash [`RedisFence::fence_key`] names, in the key's Cluster
/// slot. A fence is never deleted by distlock (deleting it would let a
/// stale holder in again): a few dozen bytes per fenced key.
///
/// Keys follow the [resource rule](distlock_core::fence#resource-names),
/// checked before anything is sent: a fenced write never names a fence
/// (its own key's or another's: it cannot delete or lower one) nor a lock's
/// internal keys (`{LOCK}:fence`, ...), even when the key comes from a
/// request. It cannot tell a lock's own key (the provider's key prefix and
/// the lock's name) from yours: build a key that comes from a request
/// under a prefix no lock key starts with (`data:` and the request's id,
/// the locks under [`RedisOptions::key_prefix`](crate::RedisOptions::key_prefix)
/// `("locks:")`), or keep the locks in another database.
///
/// **A lost reply.** A write whose reply does not come back (a reset, the
/// response timeout) is [`Error::Connection`] or [`Error::Timeout`]:
/// retryable, and the outcome is unknown (it may have landed or not); it
/// is never reported as admitted or as stale. Retrying the same write with
/// the same token settles it: if the first landed, the retry is admitted as
/// the same holder's (equal token) and writes again, which is harmless for
/// [`set`](RedisFence::set), [`hset`](RedisFence::hset) and
/// [`del`](RedisFence::del); [`incr`](RedisFence::incr) is not idempotent
/// (a retry after a lost reply may add twice: use `set` of a computed
/// value, or a [`GuardedScript`] that records a request id, where that
/// matters); if a newer holder wrote in between, the retry is
/// [`Error::Stale`].
#[derive(Clone, Debug)]
pub struct RedisFence {
    shared: Arc<Context>,
}

/// A script of the caller's run by [`RedisFence::eval`] only if the token
/// is admitted, atomically with the check: the body is an ordinary Redis
/// Lua script body, reading its own `KEYS` and `ARGV` (the fence's are
/// taken off before it runs) and returning its reply.
///
/// An error reply of the body (`return redis.error_reply(...)`) is returned
/// as an error and records nothing; a runtime error of the body aborts the
/// script (Redis keeps the writes the body made before it, as for any
/// script) and records nothing. The body must not declare globals (Redis
/// forbids them).
///
/// ```
/// use distlock_redis::GuardedScript;
///
/// // Appends an entry to a list and trims it, if the token is admitted.
/// let append = GuardedScript::new(
///     "redis.call('RPUSH', KEYS[1], ARGV[1]) \
///      redis.call('LTRIM', KEYS[1], -100, -1) \
///      return redis.call('LLEN', KEYS[1])",
/// );
/// # let _ = append;
/// ```
#[derive(Clone, Debug)]
pub struct GuardedScript {
    script: Script,
}

impl GuardedScript {
    /// Wraps `body` (the Lua of a script, its `KEYS` and `ARGV` the
    /// caller's).
    #[must_use]
    pub fn new(body: &str) -> Self {
        let frame = include_str!("scripts/guarded_script.lua");
        let framed = frame.replacen(BODY_MARKER, &format!("{body}\n"), 1);
        GuardedScript {
            script: Script::new(&format!("{RULE}{framed}")),
        }
    }
}

/// The fence hash of `key`, in `key`'s Cluster slot: `{key}:distlock:highest`,
/// or for a key with a hash tag `{tag}…`, `{tag}:distlock:highest:key`.
///
/// The resource rule refuses every key of a fence's shape, so no fenced
/// write names a fence (its own or another key's), and a key with a `}`
/// but no hash tag (`{key}…` would hash the part before that `}`: another
/// slot).
fn fence_key(key: &str) -> Result<String> {
    check_resource(key)?;
    if let Some(tag) = hash_tag(key) {
        return Ok(format!("{{{tag}}}:distlock:highest:{key}"));
    }
    Ok(format!("{{{key}}}:distlock:highest"))
}

/// The part of `key` Redis Cluster hashes, when it has a non-empty
/// `{hash tag}`.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

fn hold_arg(token: FenceToken) -> &'static str {
    if token.is_exclusive() {
        "x"
    } else {
        "s"
    }
}

/// The code of a server error under `e` (`WRONGTYPE`, …).
fn server_code(e: &Error) -> Option<String> {
    match e {
        Error::Server { source, .. } => source
            .downcast_ref::<RedisError>()
            .and_then(RedisError::code)
            .map(str::to_owned),
        _ => None,
    }
}

fn parse_token(v: &Value, key: &str) -> Result<u64> {
    let conflict = || not_a_fence(key);
    match v {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(conflict),
        Value::Int(i) => u64::try_from(*i).map_err(|_| conflict()),
        Value::Nil => Ok(0),
        _ => Err(conflict()),
    }
}

fn not_a_fence(key: &str) -> Error {
    Error::Conflict {
        what: format!("redis key {key:?}"),
        expected: "fence (a hash of tokens)",
    }
}

impl RedisFence {
    /// Fenced writes over `provider`'s connection. Connect a provider to
    /// the Redis that holds the data (it may be another one than the
    /// locks'): `RedisProvider::connect(url)` or `connect_cluster`.
    #[must_use]
    pub fn new(provider: &RedisProvider) -> Self {
        RedisFence {
            shared: Arc::clone(&provider.shared),
        }
    }

    /// The name of `key`'s fence (a hash with the fields `token` and
    /// `exclusive`): `{key}:distlock:highest`, or `{tag}:distlock:highest:key`
    /// for a key with a hash tag, so that it shares the key's Cluster slot.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a key the [resource
    /// rule](distlock_core::fence#resource-names) refuses: empty, over
    /// [`MAX_RESOURCE_LEN`](distlock_core::fence::MAX_RESOURCE_LEN) bytes,
    /// with a control character, with a `}` but no hash tag (its fence
    /// could not share its slot), or of the shape of distlock's own keys
    /// (a fence itself, a lock's counter, ...).
    pub fn fence_key(key: &str) -> Result<String> {
        fence_key(key)
    }

    /// Runs `script` (one of ours) on `fence` and `keys` with the token and
    /// `args`; the admitted reply, or [`Error::Stale`].
    async fn run(
        &self,
        operation: &'static str,
        script: &Script,
        fence: &str,
        keys: &[&str],
        token: FenceToken,
        args: impl FnOnce(&mut ScriptInvocation<'_>),
    ) -> Result<Vec<Value>> {
        let token = token.check()?;
        let mut invocation = script.key(fence);
        for k in keys {
            invocation.key(*k);
        }
        invocation.arg(token.token()).arg(hold_arg(token));
        args(&mut invocation);
        let timeout = self.shared.options.response_timeout;
        let conn = self.shared.conn()?.pin(timeout).await?;
        let reply: Result<Vec<Value>> = with_timeout(
            operation,
            timeout,
            conn.script(operation, timeout, &invocation),
        )
        .await?;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                return Err(match server_code(&e).as_deref() {
                    Some("WRONGTYPE") => Error::Conflict {
                        what: format!("redis key {:?} or its fence {fence:?}", keys.first()),
                        expected: "key of the type the fenced write needs",
                    },
                    Some("DISTLOCK_FENCE") => not_a_fence(fence),
                    _ => e,
                })
            }
        };
        match reply.first() {
            Some(Value::Int(1)) => Ok(reply),
            Some(Value::Int(0)) => Err(Error::Stale {
                token: token.token(),
                highest: parse_token(reply.get(1).unwrap_or(&Value::Nil), fence)?,
            }),
            _ => Err(not_a_fence(fence)),
        }
    }

    /// `SET key value` if `token` is admitted.
    ///
    /// # Errors
    ///
    /// [`Error::Stale`] when a newer holder wrote (nothing written);
    /// [`Error::InvalidName`] for a key the [resource
    /// rule](distlock_core::fence#resource-names) refuses (a fence, a
    /// lock's internals, a control character, ...) and
    /// [`Error::InvalidOptions`] for token 0, both before anything is sent; [`Error::Conflict`] when the key's fence is not a fence;
    /// [`Error::Connection`] / [`Error::Timeout`] when the outcome is
    /// unknown (see [a lost reply](RedisFence)).
    ///
    /// # Cancellation safety
    ///
    /// Dropped after it was sent, the write may land or not, as a lost
    /// reply: retry with the same token.
    pub async fn set<V: ToRedisArgs + Send + Sync>(
        &self,
        key: &str,
        value: V,
        token: FenceToken,
    ) -> Result<()> {
        let fence = fence_key(key)?;
        self.run("fenced set", &SET, &fence, &[key], token, |i| {
            i.arg(value);
        })
        .await
        .map(drop)
    }

    /// `HSET key field value` if `token` is admitted; whether the field is
    /// new.
    ///
    /// # Errors
    ///
    /// As [`RedisFence::set`]; [`Error::Conflict`] too when the key is not
    /// a hash (nothing written).
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisFence::set`].
    pub async fn hset<F: ToRedisArgs + Send + Sync, V: ToRedisArgs + Send + Sync>(
        &self,
        key: &str,
        field: F,
        value: V,
        token: FenceToken,
    ) -> Result<bool> {
        let fence = fence_key(key)?;
        let reply = self
            .run("fenced hset", &HSET, &fence, &[key], token, |i| {
                i.arg(field).arg(value);
            })
            .await?;
        Ok(matches!(reply.get(1), Some(Value::Int(n)) if *n > 0))
    }

    /// `DEL key` if `token` is admitted; whether the key existed. The fence
    /// stays.
    ///
    /// # Errors
    ///
    /// As [`RedisFence::set`].
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisFence::set`].
    pub async fn del(&self, key: &str, token: FenceToken) -> Result<bool> {
        let fence = fence_key(key)?;
        let reply = self
            .run("fenced del", &DEL, &fence, &[key], token, |_| {})
            .await?;
        Ok(matches!(reply.get(1), Some(Value::Int(n)) if *n > 0))
    }

    /// `INCRBY key by` if `token` is admitted; the value after it. Not
    /// idempotent: see [a lost reply](RedisFence).
    ///
    /// # Errors
    ///
    /// As [`RedisFence::set`]; [`Error::Server`] when the key does not hold
    /// an integer or the sum would overflow (nothing written).
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisFence::set`].
    pub async fn incr(&self, key: &str, by: i64, token: FenceToken) -> Result<i64> {
        let fence = fence_key(key)?;
        let reply = self
            .run("fenced incr", &INCR, &fence, &[key], token, |i| {
                i.arg(by);
            })
            .await?;
        match reply.get(1) {
            Some(Value::Int(v)) => Ok(*v),
            _ => Err(not_a_fence(&fence)),
        }
    }

    /// Runs `script` on `keys` with `args` if `token` is admitted on
    /// `resource` (whose fence is checked and recorded); the script's
    /// reply. On Cluster, `keys` must share `resource`'s slot (use a hash
    /// tag: Redis refuses other keys with `CROSSSLOT`). Each of `keys`
    /// follows the [resource rule](distlock_core::fence#resource-names)
    /// too (so no fence and no lock's internals are among them); the body
    /// writes only the keys it is given, as every Redis script should.
    ///
    /// # Errors
    ///
    /// As [`RedisFence::set`] ([`Error::InvalidName`] for `resource` or
    /// one of `keys`, nothing sent); the script's own error reply as
    /// [`Error::Server`] (its token not recorded); [`Error::Conflict`] when
    /// its reply does not convert to `T`.
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisFence::set`].
    pub async fn eval<T: FromRedisValue, A: ToRedisArgs + Send + Sync>(
        &self,
        script: &GuardedScript,
        resource: &str,
        keys: &[&str],
        args: &[A],
        token: FenceToken,
    ) -> Result<T> {
        let fence = fence_key(resource)?;
        // The script may write its keys: none of them may be a fence or a
        // lock's internals.
        for key in keys {
            check_resource(key)?;
        }
        let mut reply = self
            .run("fenced script", &script.script, &fence, keys, token, |i| {
                for a in args {
                    i.arg(a);
                }
            })
            .await?;
        let value = if reply.len() > 1 {
            reply.swap_remove(1)
        } else {
            Value::Nil
        };
        T::from_redis_value(value).map_err(|e| Error::Conflict {
            what: format!("the reply of a guarded script on {resource:?} ({e})"),
            expected: "reply of the type asked for",
        })
    }

    /// What `key`'s fence has admitted (zeros for a key never written
    /// through it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad key; [`Error::Conflict`] when its
    /// fence is not a fence; the connection's errors.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn highest(&self, key: &str) -> Result<Highest> {
        let fence = fence_key(key)?;
        let timeout = self.shared.options.response_timeout;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&fence).arg("token").arg("exclusive");
        let reply: redis::RedisResult<Vec<Value>> = with_timeout(
            "fence highest",
            timeout,
            self.shared.conn()?.query(timeout, &cmd),
        )
        .await??;
        let reply = reply.map_err(|e| {
            if e.code() == Some("WRONGTYPE") {
                not_a_fence(&fence)
            } else {
                crate::error::from_redis("fence highest", timeout, e)
            }
        })?;
        match reply.as_slice() {
            [token, exclusive] => Ok(Highest {
                token: parse_token(token, &fence)?,
                exclusive: parse_token(exclusive, &fence)?,
            }),
            _ => Err(not_a_fence(&fence)),
        }
    }

    /// Admits `token` on `key` without a write (a barrier, see
    /// [`Fence::admit`]); the fence's numbers after it.
    ///
    /// # Errors
    ///
    /// As [`RedisFence::set`].
    ///
    /// # Cancellation safety
    ///
    /// As [`RedisFence::set`].
    pub async fn admit(&self, key: &str, token: FenceToken) -> Result<Highest> {
        let fence = fence_key(key)?;
        let reply = self
            .run("fence admit", &ADMIT, &fence, &[], token, |_| {})
            .await?;
        match reply.as_slice() {
            [_, token, exclusive] => Ok(Highest {
                token: parse_token(token, &fence)?,
                exclusive: parse_token(exclusive, &fence)?,
            }),
            _ => Err(not_a_fence(&fence)),
        }
    }
}

#[async_trait]
impl Fence for RedisFence {
    async fn admit(&self, _cx: &mut (), resource: &str, token: FenceToken) -> Result<Highest> {
        RedisFence::admit(self, resource, token).await
    }

    async fn highest(&self, _cx: &mut (), resource: &str) -> Result<Highest> {
        RedisFence::highest(self, resource).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_fence_shares_its_slot() {
        assert_eq!(
            fence_key("orders:42").unwrap(),
            "{orders:42}:distlock:highest"
        );
        assert_eq!(
            fence_key("{user1}:profile").unwrap(),
            "{user1}:distlock:highest:{user1}:profile"
        );
        assert_eq!(fence_key("a{b").unwrap(), "{a{b}:distlock:highest");
        assert!(fence_key("a}b").unwrap_err().is_invalid_input());
        assert!(fence_key("{}x").unwrap_err().is_invalid_input());
        assert!(fence_key("").unwrap_err().is_invalid_input());
    }

    #[test]
    fn a_body_goes_in_its_frame() {
        let frame = include_str!("scripts/guarded_script.lua");
        assert_eq!(frame.matches(BODY_MARKER).count(), 1);
    }
}
