//! One shared pub/sub connection per provider, waking waiters on release
//! messages.
//!
//! A single actor task owns the connection and a reference count per channel:
//! the first waiter on a lock subscribes to its channel, the last one to leave
//! unsubscribes. Messages are dispatched by payload:
//!
//! * `to:<waiter id>` (a fair hand-over) wakes exactly the waiter of this
//!   provider registered with that id ([`Subscriber::subscribe_as`]), and
//!   nobody if it waits elsewhere: one wake-up per hand-over across all
//!   providers.
//! * Any other payload (`released`, …) wakes one plain waiter of the
//!   provider ([`Subscriber::subscribe`]; as Redisson does), not all of them:
//!   the others would only lose the race and cost a round trip each. A woken
//!   waiter that was cancelled passes its wake-up on to the next.
//! * Every message wakes every observer ([`Subscriber::observe`]); wake-ups
//!   an observer has not consumed yet coalesce into one.
//!
//! When the connection drops, every waiter and observer is woken to
//! re-check (a message may have been missed) and the actor reconnects and
//! resubscribes while anyone waits. Where it connects to is its [`Source`]:
//! a fixed server, or the master the Sentinels name at each (re)connect;
//! with Sentinel it also moves (waking everyone) as soon as the provider's
//! commands found another master, even while its own connection stands (to
//! a frozen master, say). The connection is opened at the first
//! wait and then kept, so waits that come and go cost no reconnects. Waiters
//! never depend on it alone: they also re-check at the holder's expiry and
//! at a bounded interval.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, Notify};

/// What a subscription listens for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// Any message not addressed to a waiter id: one plain waiter wakes.
    Plain,
    /// Only `to:<id>` messages for this id.
    Id(String),
    /// Every message (observer number, unique per subscriber).
    Observer(u64),
}

/// Where the subscriber connects.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// Always this server.
    Fixed(Box<redis::Client>),
    /// The master the Sentinels name, asked again at each (re)connect.
    Sentinel(Arc<crate::sentinel::Resolver>),
}

impl Source {
    async fn client(&self) -> redis::RedisResult<redis::Client> {
        match self {
            Source::Fixed(client) => Ok((**client).clone()),
            Source::Sentinel(resolver) => resolver.master_client().await,
        }
    }

    /// Resolves with the new master's address each time the master found
    /// through Sentinel changes; never for a fixed server.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<Option<String>>> {
        match self {
            Source::Fixed(_) => None,
            Source::Sentinel(resolver) => Some(resolver.changes()),
        }
    }
}

async fn master_changed(
    changes: &mut Option<tokio::sync::watch::Receiver<Option<String>>>,
) -> Option<String> {
    match changes {
        Some(rx) => match rx.changed().await {
            Ok(()) => rx.borrow_and_update().clone(),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The payload prefix of a message addressed to one waiter.
pub(crate) const ADDRESSED: &str = "to:";

enum Command {
    Subscribe {
        channel: String,
        kind: Kind,
        reply: oneshot::Sender<Arc<Notify>>,
    },
    Unsubscribe(String, Kind),
    /// The provider was closed: drop the connection and end.
    ShutDown,
}

/// Counters for tests and benches.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Messages delivered to a waiter (plain or by id): each wakes one.
    /// Observer wake-ups are not counted.
    pub(crate) messages: AtomicU64,
    /// Pub/sub connections opened.
    pub(crate) connections: AtomicU64,
}

/// The handle waiters use; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Subscriber {
    tx: mpsc::UnboundedSender<Command>,
    pub(crate) stats: Arc<Stats>,
    observers: Arc<AtomicU64>,
}

/// A waiter's interest in one channel; unsubscribes when dropped.
///
/// It exists from the moment the subscribe command is sent, so a waiter
/// cancelled while waiting for the actor's answer still unsubscribes: every
/// subscribe command is matched by exactly one unsubscribe.
pub(crate) struct Subscription {
    channel: String,
    kind: Kind,
    wake: Option<Arc<Notify>>,
    tx: mpsc::UnboundedSender<Command>,
    sent: bool,
}

impl Subscription {
    /// Resolves when this waiter is woken (a release message, or a reconnect
    /// that may have lost one); pends forever if the subscriber is gone,
    /// leaving waiters to their timers.
    pub(crate) async fn changed(&mut self) {
        match &self.wake {
            Some(wake) => {
                wake.notified().await;
                distlock_core::backend::woke();
            }
            None => std::future::pending::<()>().await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.sent {
            let _ = self.tx.send(Command::Unsubscribe(
                std::mem::take(&mut self.channel),
                self.kind.clone(),
            ));
        }
    }
}

impl Subscriber {
    /// Starts the actor on the current runtime. It ends when every handle is
    /// dropped.
    pub(crate) fn spawn(client: Source, timeout: Duration) -> Subscriber {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Stats::default());
        tokio::spawn(run(client, timeout, rx, Arc::clone(&stats)));
        Subscriber {
            tx,
            stats,
            observers: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Ends the actor and its connection (the provider was closed); later
    /// subscriptions pend, leaving waiters to their timers and the closed
    /// signal.
    pub(crate) fn shut_down(&self) {
        let _ = self.tx.send(Command::ShutDown);
    }

    /// Registers interest in `channel`; returns once the server confirmed the
    /// subscription (or the attempt failed: the waiter then relies on its
    /// timers).
    pub(crate) async fn subscribe(&self, channel: String) -> Subscription {
        self.register(channel, Kind::Plain).await
    }

    /// Registers a waiter known by `id` on `channel`: it is woken only by a
    /// `to:<id>` message (and by a reconnect), and a wake-up that comes while
    /// it is not waiting is kept for its next [`Subscription::changed`].
    pub(crate) async fn subscribe_as(&self, channel: String, id: String) -> Subscription {
        self.register(channel, Kind::Id(id)).await
    }

    /// Registers an observer of `channel`: woken by every message (and by a
    /// reconnect); wake-ups not consumed yet coalesce into one.
    pub(crate) async fn observe(&self, channel: String) -> Subscription {
        let n = self.observers.fetch_add(1, Ordering::Relaxed);
        self.register(channel, Kind::Observer(n)).await
    }

    async fn register(&self, channel: String, kind: Kind) -> Subscription {
        let (reply, answer) = oneshot::channel();
        let mut subscription = Subscription {
            channel: channel.clone(),
            kind: kind.clone(),
            wake: None,
            tx: self.tx.clone(),
            sent: false,
        };
        subscription.sent = self
            .tx
            .send(Command::Subscribe {
                channel,
                kind,
                reply,
            })
            .is_ok();
        if subscription.sent {
            subscription.wake = answer.await.ok();
        }
        subscription
    }
}

struct Channel {
    refs: usize,
    /// Plain waiters share one: a message wakes one of them.
    wake: Arc<Notify>,
    /// Waiters by id, each with its own.
    ids: HashMap<String, Arc<Notify>>,
    /// Observers, each with its own.
    observers: HashMap<u64, Arc<Notify>>,
}

struct Actor {
    client: Source,
    timeout: Duration,
    channels: HashMap<String, Channel>,
    conn: Option<(PubSubSink, PubSubStream)>,
    /// The address `conn` is connected to.
    connected_to: Option<String>,
    stats: Arc<Stats>,
}

impl Actor {
    fn wake_all(&self) {
        for ch in self.channels.values() {
            ch.wake.notify_waiters();
            // Kept as a permit: a waiter busy with a request re-checks after.
            for wake in ch.ids.values().chain(ch.observers.values()) {
                wake.notify_one();
            }
        }
    }

    /// Opens the connection and subscribes to every channel in use.
    async fn connect(&mut self) -> bool {
        let opened = tokio::time::timeout(self.timeout, async {
            let client = self.client.client().await?;
            self.connected_to = Some(crate::sentinel::address(&client));
            let (mut sink, stream) = client.get_async_pubsub().await?.split();
            let names: Vec<&String> = self.channels.keys().collect();
            if !names.is_empty() {
                sink.subscribe(names).await?;
            }
            Ok::<_, redis::RedisError>((sink, stream))
        })
        .await;
        match opened {
            Ok(Ok(conn)) => {
                self.stats.connections.fetch_add(1, Ordering::Relaxed);
                self.conn = Some(conn);
                // Messages sent while we were away are lost: re-check.
                self.wake_all();
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "distlock redis subscriber cannot connect");
                false
            }
            Err(_) => {
                tracing::debug!("distlock redis subscriber connect timed out");
                false
            }
        }
    }

    fn disconnect(&mut self) {
        if self.conn.take().is_some() {
            tracing::debug!("distlock redis subscriber lost its connection");
        }
        self.wake_all();
    }

    async fn subscribe(&mut self, channel: String, kind: Kind) -> Arc<Notify> {
        let entry = self
            .channels
            .entry(channel.clone())
            .or_insert_with(|| Channel {
                refs: 0,
                wake: Arc::new(Notify::new()),
                ids: HashMap::new(),
                observers: HashMap::new(),
            });
        entry.refs += 1;
        let rx = match kind {
            Kind::Plain => Arc::clone(&entry.wake),
            Kind::Id(id) => Arc::clone(entry.ids.entry(id).or_default()),
            Kind::Observer(n) => Arc::clone(entry.observers.entry(n).or_default()),
        };
        if entry.refs > 1 {
            return rx;
        }
        if self.conn.is_none() {
            // Connecting subscribes every channel, this one included.
            self.connect().await;
            return rx;
        }
        if let Some((sink, _)) = &mut self.conn {
            let ok = tokio::time::timeout(self.timeout, sink.subscribe(&channel)).await;
            if !matches!(ok, Ok(Ok(()))) {
                self.disconnect();
            }
        }
        rx
    }

    async fn unsubscribe(&mut self, channel: String, kind: Kind) {
        let Some(entry) = self.channels.get_mut(&channel) else {
            return;
        };
        match kind {
            Kind::Plain => {}
            Kind::Id(id) => {
                entry.ids.remove(&id);
            }
            Kind::Observer(n) => {
                entry.observers.remove(&n);
            }
        }
        entry.refs -= 1;
        if entry.refs > 0 {
            return;
        }
        self.channels.remove(&channel);
        if let Some((sink, _)) = &mut self.conn {
            let ok = tokio::time::timeout(self.timeout, sink.unsubscribe(&channel)).await;
            if !matches!(ok, Ok(Ok(()))) {
                self.disconnect();
            }
        }
    }

    fn deliver(&self, msg: &redis::Msg) {
        let Some(ch) = self.channels.get(msg.get_channel_name()) else {
            return;
        };
        for wake in ch.observers.values() {
            wake.notify_one();
        }
        let payload: String = msg.get_payload().unwrap_or_default();
        if let Some(id) = payload.strip_prefix(ADDRESSED) {
            // For one waiter, perhaps of another provider: nobody else.
            if let Some(wake) = ch.ids.get(id) {
                self.stats.messages.fetch_add(1, Ordering::Relaxed);
                wake.notify_one();
            }
            return;
        }
        // Only plain waiters count: observers are not waiters.
        if ch.refs > ch.ids.len() + ch.observers.len() {
            self.stats.messages.fetch_add(1, Ordering::Relaxed);
            ch.wake.notify_one();
        }
    }
}

async fn next_message(conn: &mut Option<(PubSubSink, PubSubStream)>) -> Option<redis::Msg> {
    match conn {
        Some((_, stream)) => stream.next().await,
        None => std::future::pending().await,
    }
}

async fn run(
    client: Source,
    timeout: Duration,
    mut commands: mpsc::UnboundedReceiver<Command>,
    stats: Arc<Stats>,
) {
    let mut actor = Actor {
        client,
        timeout,
        channels: HashMap::new(),
        conn: None,
        connected_to: None,
        stats,
    };
    let mut changes = actor.client.changes();
    let mut backoff = Duration::from_millis(50);
    loop {
        let reconnect = actor.conn.is_none() && !actor.channels.is_empty();
        tokio::select! {
            command = commands.recv() => match command {
                None | Some(Command::ShutDown) => return,
                Some(Command::Subscribe { channel, kind, reply }) => {
                    let wake = actor.subscribe(channel, kind).await;
                    // A waiter cancelled meanwhile unsubscribes on its own.
                    let _ = reply.send(wake);
                }
                Some(Command::Unsubscribe(channel, kind)) => {
                    actor.unsubscribe(channel, kind).await;
                }
            },
            msg = next_message(&mut actor.conn) => match msg {
                Some(msg) => actor.deliver(&msg),
                None => actor.disconnect(),
            },
            // The commands found another master (a failover while this
            // connection still stands, to a frozen or demoted server): move.
            master = master_changed(&mut changes) => {
                if actor.conn.is_some() && master.is_some() && master != actor.connected_to {
                    actor.disconnect();
                }
            }
            () = tokio::time::sleep(backoff), if reconnect => {
                if actor.connect().await {
                    backoff = Duration::from_millis(50);
                } else {
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}
