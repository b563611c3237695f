//! Wake-ups when a lock key held by a client that does not announce its
//! release changes (redis-py's `Lock`, a key set by hand).
//!
//! What the waiter gets and where tracking is not available is told once,
//! in the crate docs' [mutex](crate#the-mutex) section ("Next to clients
//! that do not publish"). Here: the one RESP3 connection with `CLIENT
//! TRACKING ON`, opened at the first such wait; a read (`EXISTS`) per wait,
//! since tracking is one-shot per read, shared by the waiters of one key
//! while no change has come since; `None` where tracking is refused. Only
//! the current connection's end counts: the late end, failure or timeout of
//! one already replaced leaves its successor alone; and only the response
//! timeout judges the connection: a caller whose own deadline comes first
//! just stops waiting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::watch;
use tokio::time::Instant;

/// After a failed connect, no new attempt for this long (waiters poll
/// meanwhile).
const RETRY_CONNECT: Duration = Duration::from_secs(1);

/// One provider's tracking connection and the keys its waiters watch.
#[derive(Debug)]
pub(crate) struct Tracker {
    /// The server to track on (RESP3); `None` where tracking is not used.
    client: Option<redis::Client>,
    inner: Arc<Inner>,
    conn: tokio::sync::Mutex<Connection>,
    timeout: Duration,
}

#[derive(Debug, Default)]
struct Connection {
    conn: Option<MultiplexedConnection>,
    /// A connection was opened before (a new one replaces it).
    opened: bool,
    /// When the last connect failed for a reason that may pass.
    failed_at: Option<Instant>,
}

/// What the push handler (running in the connection's driver) shares with
/// the waiters.
#[derive(Debug, Default)]
struct Inner {
    keys: Mutex<HashMap<Vec<u8>, Entry>>,
    /// The latest connection generation found dead (its end reported, a
    /// read on it failed or went unanswered; 0: none): when it is the
    /// current one, the next watch reconnects.
    dead: AtomicU64,
    /// The server refused tracking (or RESP3), or the provider closed:
    /// never again on this provider.
    refused: AtomicBool,
    /// The generation of the current tracking connection (a fresh one
    /// when it is let go): a read made on an earlier one tracks nothing
    /// any more.
    generation: AtomicU64,
    /// Hands out generations, each once.
    next_generation: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    /// Bumped at each change of the key (and at a disconnect).
    changes: watch::Sender<u64>,
    watchers: usize,
    /// The connection generation and change count at which a read
    /// registered the key with the server: while both are current, a new
    /// watcher needs no read.
    tracked_at: Option<(u64, u64)>,
}

impl Inner {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Handles one push message of the tracking connection of
    /// `generation`.
    fn pushed(&self, info: &PushInfo, generation: u64) {
        match info.kind {
            PushKind::Invalidate => match info.data.first() {
                Some(Value::Array(keys)) => {
                    let map = self.keys();
                    for key in keys {
                        if let Value::BulkString(key) = key {
                            if let Some(entry) = map.get(key.as_slice()) {
                                entry.changes.send_modify(|n| *n += 1);
                            }
                        }
                    }
                }
                // A null list: the server flushed the database.
                _ => self.all_changed(),
            },
            // Only the current connection's end matters (or that of one
            // opening, whose generation is not current yet): a connection
            // already replaced must not make the tracker drop its
            // successor.
            PushKind::Disconnection => {
                self.dead.fetch_max(generation, Ordering::SeqCst);
                if generation >= self.generation.load(Ordering::SeqCst) {
                    self.all_changed();
                }
            }
            _ => {}
        }
    }

    fn all_changed(&self) {
        for entry in self.keys().values() {
            entry.changes.send_modify(|n| *n += 1);
        }
    }
}

/// One waiter's interest in one key: [`KeyWatch::changed`] resolves at the
/// key's next change after the watch was made.
pub(crate) struct KeyWatch {
    inner: Arc<Inner>,
    key: Vec<u8>,
    changes: watch::Receiver<u64>,
    /// The key was found gone already: changed at once.
    gone: bool,
    /// Whether the key existed at this watch's own read (`None`: it shares
    /// an earlier read, whose answer it does not know).
    found: Option<bool>,
}

impl KeyWatch {
    /// Resolves when the key changed (or the tracking connection dropped).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a change that comes while nobody awaits is kept
    /// for the next call.
    pub(crate) async fn changed(&mut self) {
        if self.gone {
            return;
        }
        self.next_change().await;
    }

    /// Whether the key existed at this watch's own read (`None`: the watch
    /// shares an earlier read).
    pub(crate) fn found(&self) -> Option<bool> {
        self.found
    }

    /// Resolves at the key's next change after the read, even when the
    /// read found it gone (a free lock that someone may take).
    ///
    /// # Cancellation safety
    ///
    /// As [`Self::changed`].
    pub(crate) async fn next_change(&mut self) {
        if self.changes.changed().await.is_err() {
            // The entry cannot go while this watch holds it; never resolve
            // rather than spin.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let mut map = self.inner.keys();
        if let Some(entry) = map.get_mut(self.key.as_slice()) {
            entry.watchers -= 1;
            if entry.watchers == 0 {
                map.remove(self.key.as_slice());
            }
        }
    }
}

impl Tracker {
    /// A tracker for the server `client` connects to (`None`: tracking is
    /// not used, every watch answers `None`).
    pub(crate) fn new(client: Option<&redis::Client>, timeout: Duration) -> Tracker {
        let client = client.and_then(|client| {
            let info = client.get_connection_info().clone();
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3);
            redis::Client::open(info.set_redis_settings(settings)).ok()
        });
        Tracker {
            client,
            inner: Arc::new(Inner::default()),
            conn: tokio::sync::Mutex::new(Connection::default()),
            timeout,
        }
    }

    /// Watches `key` for its next change: registers it with the server
    /// (one `EXISTS` on the tracking connection, unless another waiter's
    /// read on the same connection still stands) and returns the watch;
    /// `None` when tracking is not available now (the caller polls
    /// instead). Gives up at `until` (the caller's deadline or next
    /// re-check), which only ends this call: the connection is judged by
    /// the provider's response timeout alone.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a dropped watch leaves at most the server's
    /// tracking of the key, which costs one spurious message.
    pub(crate) async fn watch(&self, key: &str, until: Instant) -> Option<KeyWatch> {
        let client = self.client.as_ref()?;
        if self.inner.refused.load(Ordering::SeqCst) {
            return None;
        }
        let key = key.as_bytes().to_vec();
        let (changes, tracked) = {
            let mut map = self.inner.keys();
            let entry = map.entry(key.clone()).or_insert_with(|| Entry {
                changes: watch::channel(0).0,
                watchers: 0,
                tracked_at: None,
            });
            entry.watchers += 1;
            let changes = entry.changes.subscribe();
            let current = (
                self.inner.generation.load(Ordering::SeqCst),
                *changes.borrow(),
            );
            (changes, entry.tracked_at == Some(current))
        };
        let mut watch = KeyWatch {
            inner: Arc::clone(&self.inner),
            key,
            changes,
            gone: false,
            found: None,
        };
        if tracked {
            return Some(watch);
        }
        let exchange = async {
            let (mut conn, generation) = self.connection(client).await?;
            // Changes until now (the wake-up of a reconnect made for this
            // very read, say) come before the read: the read sees them.
            let before = *watch.changes.borrow_and_update();
            let mut cmd = redis::cmd("EXISTS");
            cmd.arg(&watch.key);
            let read = tokio::time::timeout(self.timeout, cmd.query_async::<u8>(&mut conn)).await;
            Some((read, generation, before))
        };
        match tokio::time::timeout_at(until, exchange).await {
            // The caller's deadline: nothing is known about the connection.
            Err(_) | Ok(None) => None,
            Ok(Some((Ok(Ok(exists)), generation, before))) => {
                watch.gone = exists == 0;
                watch.found = Some(exists != 0);
                let mut map = self.inner.keys();
                if let Some(entry) = map.get_mut(watch.key.as_slice()) {
                    if *entry.changes.borrow() == before
                        && self.inner.generation.load(Ordering::SeqCst) == generation
                    {
                        entry.tracked_at = Some((generation, before));
                    }
                }
                Some(watch)
            }
            Ok(Some((Ok(Err(e)), generation, _))) => {
                if refused(&e) {
                    self.inner.refused.store(true, Ordering::SeqCst);
                }
                self.inner.dead.fetch_max(generation, Ordering::SeqCst);
                None
            }
            // No answer within the response timeout: the connection is
            // suspect (unless it was replaced meanwhile).
            Ok(Some((Err(_), generation, _))) => {
                self.inner.dead.fetch_max(generation, Ordering::SeqCst);
                None
            }
        }
    }

    /// The tracking connection and its generation, opened (and tracking
    /// turned on) if needed; `None` when it cannot be had now.
    async fn connection(&self, client: &redis::Client) -> Option<(MultiplexedConnection, u64)> {
        let mut state = self.conn.lock().await;
        let current = self.inner.generation.load(Ordering::SeqCst);
        if state.conn.is_some() && self.inner.dead.load(Ordering::SeqCst) >= current {
            // Let go. A fresh generation: reads made on it count no more,
            // and those watching through it read again (a change may have
            // gone unannounced).
            state.conn = None;
            let fresh = self.inner.next_generation.fetch_add(1, Ordering::SeqCst) + 1;
            self.inner.generation.store(fresh, Ordering::SeqCst);
            self.inner.all_changed();
        }
        if let Some(conn) = &state.conn {
            return Some((conn.clone(), self.inner.generation.load(Ordering::SeqCst)));
        }
        if state
            .failed_at
            .is_some_and(|at| at.elapsed() < RETRY_CONNECT)
        {
            return None;
        }
        let inner = Arc::downgrade(&self.inner);
        // The generation this connection gets if it opens.
        let generation = self.inner.next_generation.fetch_add(1, Ordering::SeqCst) + 1;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(move |info: PushInfo| {
                if let Some(inner) = inner.upgrade() {
                    inner.pushed(&info, generation);
                }
                Ok::<(), redis::aio::SendError>(())
            });
        let opened = tokio::time::timeout(self.timeout, async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("CLIENT")
                .arg("TRACKING")
                .arg("ON")
                .query_async::<()>(&mut conn)
                .await?;
            Ok::<_, redis::RedisError>(conn)
        })
        .await;
        match opened {
            // Closed meanwhile: the connection goes with this call.
            Ok(Ok(_)) if self.inner.refused.load(Ordering::SeqCst) => None,
            Ok(Ok(conn)) => {
                state.failed_at = None;
                state.conn = Some(conn.clone());
                // A new connection tracks nothing yet: no earlier read
                // counts for new watchers, and those watching through the
                // one it replaces read again (on it).
                self.inner.generation.store(generation, Ordering::SeqCst);
                if std::mem::replace(&mut state.opened, true) {
                    self.inner.all_changed();
                }
                Some((conn, generation))
            }
            Ok(Err(e)) if refused(&e) => {
                tracing::debug!(error = %e, "distlock redis: no client tracking; foreign holders are polled");
                self.inner.refused.store(true, Ordering::SeqCst);
                None
            }
            Ok(Err(_)) | Err(_) => {
                state.failed_at = Some(Instant::now());
                None
            }
        }
    }

    /// Closes the tracking connection (the provider is closing). A connect
    /// under way drops what it opens (it sees the flag).
    pub(crate) fn shut_down(&self) {
        self.inner.refused.store(true, Ordering::SeqCst);
        if let Ok(mut state) = self.conn.try_lock() {
            state.conn = None;
        }
    }
}

/// The server will not do client tracking for us: an ACL without `CLIENT`
/// (or `HELLO`), or a server without RESP3 or tracking (before Redis 6).
/// Anything else (the connection, a timeout, a busy or loading server, too
/// many clients) may pass, and is tried again a moment later.
fn refused(e: &redis::RedisError) -> bool {
    if e.code() == Some("NOPERM") {
        return true;
    }
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unknown command") || text.contains("unknown subcommand")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disconnection() -> PushInfo {
        PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        }
    }

    /// An entry for `key` with one watcher; its change count.
    fn watched(inner: &Inner, key: &[u8]) -> watch::Receiver<u64> {
        let (changes, rx) = watch::channel(0);
        inner.keys().insert(
            key.to_vec(),
            Entry {
                changes,
                watchers: 1,
                tracked_at: None,
            },
        );
        rx
    }

    #[test]
    fn only_the_current_connections_end_counts() {
        let inner = Inner::default();
        let rx = watched(&inner, b"k");
        inner.generation.store(2, Ordering::SeqCst);
        // The end of connection 1, replaced by 2: nothing happens.
        inner.pushed(&disconnection(), 1);
        assert!(
            inner.dead.load(Ordering::SeqCst) < 2,
            "its successor given up"
        );
        assert_eq!(*rx.borrow(), 0, "watchers woken by a replaced connection");
        // The end of connection 2: given up, watchers woken.
        inner.pushed(&disconnection(), 2);
        assert_eq!(inner.dead.load(Ordering::SeqCst), 2);
        assert_eq!(*rx.borrow(), 1);
        // A late end of 1 cannot hide the end of 2.
        inner.pushed(&disconnection(), 1);
        assert_eq!(inner.dead.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_end_of_a_connection_still_opening_counts_once_it_is_current() {
        let inner = Inner::default();
        inner.generation.store(1, Ordering::SeqCst);
        // Connection 2 ends before it is made current.
        inner.pushed(&disconnection(), 2);
        inner.generation.store(2, Ordering::SeqCst);
        assert!(inner.dead.load(Ordering::SeqCst) >= inner.generation.load(Ordering::SeqCst));
    }

    #[test]
    fn invalidations_wake_the_watchers_of_their_keys_only() {
        let inner = Inner::default();
        let a = watched(&inner, b"a");
        let b = watched(&inner, b"b");
        inner.pushed(
            &PushInfo {
                kind: PushKind::Invalidate,
                data: vec![Value::Array(vec![Value::BulkString(b"a".to_vec())])],
            },
            1,
        );
        assert_eq!((*a.borrow(), *b.borrow()), (1, 0));
    }
}
