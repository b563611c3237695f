//! Redis leader election: the [fair queue](crate::fair_queue) on keys of
//! its own, with a leader record written, extended and deleted with the
//! lease. The protocol is told once, in the crate docs' [leader
//! election](crate#leader-election) section, its keys in [Keys](crate#keys).
//! Here: the campaign, the leader's read (`elect_leader.lua`) and the
//! observers' stream, which re-reads on every message of the election's
//! channel, at the record's expiry (an expiry publishes nothing) and every
//! re-check interval.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{validate_candidate, with_timeout};
use distlock_core::{
    Election, Error, LeaderInfo, LeaderStream, Leadership, LeaseOptions, Name, Result, Wait,
};
use redis::Value;
use tokio::time::{sleep_until, Instant};

use crate::context::Context;
use crate::fair_queue::FairQueue;
use crate::keys::Keys;
use crate::scripts::ELECT_LEADER;
use crate::wake::subscriber::Subscription;

/// Redis leader election.
///
/// # Errors
///
/// None today; the signature leaves room for checks of the lease.
pub(crate) fn election(
    shared: &Arc<Context>,
    name: Name,
    lease: LeaseOptions,
) -> Result<Arc<dyn Election>> {
    Ok(Arc::new(RedisElection {
        queue: FairQueue {
            shared: Arc::clone(shared),
            keys: Arc::new(Keys::election(&shared.options.prefix, &name)),
            name,
            lease,
        },
    }))
}

/// A Redis election.
pub(crate) struct RedisElection {
    queue: FairQueue,
}

impl fmt::Debug for RedisElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisElection")
            .field("name", &self.queue.name)
            .field("key", &self.queue.keys.lock)
            .finish_non_exhaustive()
    }
}

/// The leader now and how long its record has left.
async fn current(shared: &Context, keys: &Keys) -> Result<(Option<LeaderInfo>, Option<Duration>)> {
    let Some(record) = &keys.record else {
        return Ok((None, None));
    };
    let timeout = shared.options.response_timeout;
    let conn = shared.conn()?.pin(timeout).await?;
    let invocation = ELECT_LEADER.key(record);
    let reply: Vec<Value> = with_timeout(
        "leader",
        timeout,
        conn.script("leader", timeout, &invocation),
    )
    .await??;
    let conflict = || Error::Conflict {
        what: format!("redis key {record:?}"),
        expected: "election leader record (\"<term> <candidate>\")",
    };
    match reply.as_slice() {
        [Value::Nil, _] => Ok((None, None)),
        [Value::BulkString(data), Value::Int(pttl)] => {
            let text = std::str::from_utf8(data).map_err(|_| conflict())?;
            let (term, id) = text.split_once(' ').ok_or_else(conflict)?;
            let term = term.parse::<u64>().map_err(|_| conflict())?;
            let left = u64::try_from(*pttl).ok().map(Duration::from_millis);
            Ok((
                Some(LeaderInfo {
                    id: id.to_owned(),
                    term,
                }),
                left,
            ))
        }
        _ => Err(conflict()),
    }
}

#[async_trait]
impl Election for RedisElection {
    fn name(&self) -> &Name {
        &self.queue.name
    }

    async fn campaign(&self, candidate: &str) -> Result<Leadership> {
        validate_candidate(candidate)?;
        distlock_core::backend::measured_campaign("redis", &self.queue.name, async {
            let guard = self
                .queue
                .acquire(Wait::Forever, Some(candidate))
                .await?
                .ok_or(Error::Closed)?;
            Ok(Leadership::new(guard, candidate))
        })
        .await
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>> {
        self.queue.shared.lifecycle.check_open()?;
        Ok(current(&self.queue.shared, &self.queue.keys).await?.0)
    }

    fn observe(&self) -> LeaderStream {
        struct State {
            shared: Arc<Context>,
            keys: Arc<Keys>,
            last: Option<Option<LeaderInfo>>,
            subscription: Option<Subscription>,
            /// When the leader's record expires, if there is one.
            expires: Option<Instant>,
            /// Set once the provider is closed: the stream ends.
            done: bool,
        }
        let state = State {
            shared: Arc::clone(&self.queue.shared),
            keys: Arc::clone(&self.queue.keys),
            last: None,
            subscription: None,
            expires: None,
            done: false,
        };
        Box::pin(futures::stream::unfold(state, |mut state| async move {
            if state.done {
                return None;
            }
            loop {
                match &mut state.subscription {
                    // Subscribed before the first read: no change between
                    // the read and the subscription is missed.
                    None => {
                        let channel = state.keys.channel.clone();
                        // Its confirmation wakes the wait below for
                        // another read.
                        state.subscription = Some(state.shared.subscriber.observe(channel));
                    }
                    Some(sub) if state.last.is_some() => {
                        let expires = state.expires;
                        // Never on pub/sub alone: a silent connection (until
                        // the subscriber replaces it) or a lost message is
                        // made up for by a read every re-check interval.
                        let recheck = state.shared.options.recheck_interval;
                        tokio::select! {
                            _ = sub.changed() => {}
                            () = sleep_until(expires.unwrap_or_else(Instant::now)), if expires.is_some() => {}
                            () = tokio::time::sleep(recheck) => {}
                            () = state.shared.lifecycle.closed() => {}
                        }
                    }
                    Some(_) => {}
                }
                if let Err(e) = state.shared.lifecycle.check_open() {
                    state.done = true;
                    return Some((Err(e), state));
                }
                match current(&state.shared, &state.keys).await {
                    Ok((leader, left)) => {
                        // A millisecond past the expiry: the server has
                        // dropped the record by then.
                        state.expires = left.map(|l| Instant::now() + l + Duration::from_millis(1));
                        if state.last.as_ref() != Some(&leader) {
                            state.last = Some(leader.clone());
                            return Some((Ok(leader), state));
                        }
                    }
                    Err(e) => {
                        // Report, then look again after a pause.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        state.expires = Some(Instant::now());
                        return Some((Err(e), state));
                    }
                }
            }
        }))
    }
}
