//! The plain mutex's line of waiting providers, as this provider keeps its
//! place in it: a waiter's place ([`InLine`]), and the background work the
//! subscriber hands over (passing an unclaimed hand-over on, keeping the
//! places alive after each answered health check).

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::context::Context;
use crate::keys::Keys;

/// A waiter's place in its lock's line: when the last waiter of this
/// provider leaves without the lock (timeout, cancellation, error), the
/// provider leaves the line, passing on a reservation a release may have
/// made for it meanwhile.
pub(crate) struct InLine<'a> {
    subscriber: &'a crate::wake::subscriber::Subscriber,
    channel: &'a str,
    /// Set once an attempt queued; cleared by the acquisition.
    pub(crate) armed: bool,
}

impl<'a> InLine<'a> {
    /// Counted as outstanding work of the provider while it lives, so that
    /// a `close()` lets the waiter it wakes leave the line before the
    /// connection goes.
    pub(crate) fn new(
        subscriber: &'a crate::wake::subscriber::Subscriber,
        channel: &'a str,
    ) -> Self {
        subscriber.outstanding.enter();
        InLine {
            subscriber,
            channel,
            armed: false,
        }
    }
}

impl InLine<'_> {
    /// Leaves the line now, within `within`, if this was the last waiter
    /// of the provider on this lock (the subscription dropped already):
    /// the caller returns only once the provider is out of line, so a
    /// program that ends then (or drops its provider) leaves nothing that
    /// a release would reserve the lock for. A leave that fails or takes
    /// longer is left to the drop (through the subscriber's line task);
    /// the provider's place expires by itself anyway (see the crate docs).
    pub(crate) async fn leave(&mut self, shared: &Context, keys: &Keys, within: Duration) {
        if !self.armed {
            return;
        }
        if self.subscriber.plain_waiters(self.channel) > 0 {
            // Others of this provider still wait: they keep the place.
            self.armed = false;
            return;
        }
        if within.is_zero() {
            return;
        }
        let Some(invocation) = keys.pass(self.subscriber.id()) else {
            return;
        };
        let left = tokio::time::timeout(within, async {
            let conn = shared.conn()?.pin(within).await?;
            conn.script::<i64>("leave the line", within, &invocation)
                .await
        })
        .await;
        match left {
            Ok(Ok(_)) => self.armed = false,
            Ok(Err(e)) => {
                tracing::debug!(channel = %self.channel, error = %e, "distlock redis: leaving the line failed");
            }
            Err(_) => {
                tracing::debug!(channel = %self.channel, "distlock redis: leaving the line timed out");
            }
        }
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if self.armed && self.subscriber.plain_waiters(self.channel) == 0 {
            self.subscriber.leave_line(self.channel);
        }
        // After the leave was counted: never zero in between.
        self.subscriber.outstanding.exit();
    }
}

/// Marks one piece of [`Outstanding`](crate::wake::subscriber::Outstanding) work
/// over when dropped.
struct Done<'a>(&'a crate::wake::subscriber::Outstanding);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.exit();
    }
}

/// Runs the subscriber's line work (see `subscriber::LineWork`): takes this
/// provider out of a plain mutex's line, passing on the lock's reservation
/// if a release made one for it (`mutex_pass.lua`), for each channel the
/// subscriber reports a hand-over nobody here claimed, or the last waiter
/// here gave up. Ends with the provider.
pub(crate) async fn pass_unclaimed(
    shared: std::sync::Weak<Context>,
    mut work: tokio::sync::mpsc::UnboundedReceiver<crate::wake::subscriber::LineWork>,
) {
    use crate::wake::subscriber::LineWork;
    while let Some(LineWork::Pass(channel)) = work.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Each pass received is outstanding work (see `Passes`) until it
        // is over, whatever its outcome.
        let _done = Done(&shared.subscriber.outstanding);
        let Some(keys) = Keys::of_channel(&channel) else {
            continue;
        };
        let Some(invocation) = keys.pass(shared.subscriber.id()) else {
            continue;
        };
        let what = "pass the lock on";
        if let Err(e) = line_script(&shared, what, &invocation).await {
            // A reservation expires by itself (waiters re-check then).
            tracing::debug!(%channel, error = %e, "distlock redis: {what} failed");
        }
    }
}

/// Keeps this provider's places in plain mutexes' lines alive after each
/// answered health check of the pub/sub connection (`line_alive.lua`, see
/// `subscriber::Refreshes`): each batch of pending refreshes at once, each
/// vouching only for what is left of its answer's `H + T` (none left, or
/// no waiter of this provider on the line any more: skipped). Ends with
/// the provider.
pub(crate) async fn refresh_places(
    shared: std::sync::Weak<Context>,
    mut refreshes: crate::wake::subscriber::Refreshes,
) {
    while let Some(batch) = refreshes.next().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // A refresh left unanswered may still have run: send no more until
        // the command path answers (the places then expire by themselves,
        // `H + T` after the last refresh that ran).
        if !shared.replies.heard() && !answers_a_ping(&shared).await {
            continue;
        }
        let calls = batch.into_iter().map(|(channel, until)| {
            let shared = &shared;
            async move {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() || shared.subscriber.plain_waiters(&channel) == 0 {
                    return;
                }
                let Some(keys) = Keys::of_channel(&channel) else {
                    return;
                };
                let Some(invocation) = keys.keep_alive(shared.subscriber.id(), left) else {
                    return;
                };
                let what = "keep the place in line";
                let done = line_script(shared, what, &invocation).await;
                shared.replies.note(&done);
                if matches!(done, Ok(0)) && shared.subscriber.plain_waiters(&channel) > 0 {
                    // Our place is gone (it expired, or a release dropped
                    // it as dead) while our waiters wait: without a look
                    // again, only their re-check would queue us anew.
                    shared.subscriber.recheck(&channel);
                }
                shared
                    .subscriber
                    .stats
                    .refreshes
                    .fetch_add(1, Ordering::Relaxed);
                if let Err(e) = done {
                    // A place in line not kept alive expires by itself.
                    tracing::debug!(%channel, error = %e, "distlock redis: {what} failed");
                }
            }
        });
        futures::future::join_all(calls).await;
    }
}

/// Whether the command connection answers a `PING` within the response
/// timeout (counted in [`Context::replies`]).
async fn answers_a_ping(shared: &Context) -> bool {
    let timeout = shared.options.response_timeout;
    let answered = async {
        let (conn, ping) = (shared.conn()?, redis::cmd("PING"));
        let reply = conn.query::<String>(timeout, &ping).await?;
        reply.map_err(|e| crate::error::from_redis("ping", timeout, e))
    };
    let answered = distlock_core::backend::with_timeout("ping", timeout, answered)
        .await
        .and_then(|r| r);
    shared.replies.note(&answered);
    answered.is_ok()
}

/// Runs one line script on the command connection, within the response
/// timeout.
async fn line_script(
    shared: &Context,
    what: &'static str,
    invocation: &redis::ScriptInvocation<'_>,
) -> distlock_core::Result<i64> {
    let timeout = shared.options.response_timeout;
    let conn = shared.conn()?.pin(timeout).await?;
    distlock_core::backend::with_timeout(
        what,
        timeout,
        conn.script::<i64>(what, timeout, invocation),
    )
    .await?
}
