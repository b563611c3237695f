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
//! * `to:<provider id>` (the plain mutex's hand-over to the first provider
//!   in its line, see `mutex_release.lua`) wakes one plain waiter of the
//!   provider with that [`Subscriber::id`]. When none of its plain waiters
//!   waits on the channel any more, the hand-over is *unclaimed*: the
//!   channel goes to [`Subscriber::take_unclaimed`]'s receiver, whose owner
//!   passes the reservation on (`mutex_pass.lua`).
//! * `turn:<ms>[:<provider id>]` (a release left the plain mutex free for
//!   clients outside its line) holds every plain waiter of this provider
//!   back for `<ms>` ([`Subscriber::held_back`]), and wakes one of them
//!   only when the provider is the one named (or none is), as below.
//! * Any other payload (`released`, …) wakes one plain waiter of the
//!   provider ([`Subscriber::subscribe`]; as Redisson does), not all of them:
//!   the others would only lose the race and cost a round trip each. A woken
//!   waiter that was cancelled passes its wake-up on to the next.
//! * Every message wakes every observer ([`Subscriber::observe`]); wake-ups
//!   an observer has not consumed yet coalesce into one.
//!
//! While any channel is subscribed, the actor health-checks the connection
//! (the promises and their bounds are told in the crate docs'
//! [Liveness](crate#liveness); here, how)
//! (`PING` every [`Timing::health_every`], answered within
//! [`Timing::answer_within`], or answered by any message read after it
//! was sent: a flood delays the reply); each answer vouches for the connection
//! until the next one is due ([`Subscriber::alive_for`]), and refreshes
//! this provider's places in the lines its plain waiters wait in
//! ([`Refreshes`]: at most one pending per line, carrying the deadline the
//! answer vouches for, run apart from the leaves). When the connection drops, or a health check
//! or a `SUBSCRIBE` gets no answer in time (a silent, half-open
//! connection), every waiter and observer is woken to re-check (a message
//! may have been missed) and the actor reconnects and resubscribes while
//! anyone waits. Nobody waits for the actor's answer to a subscription:
//! a [`Subscription`] wakes its waiter when it took effect, so a slow
//! `SUBSCRIBE` never holds a caller past its deadline. Where it connects to is its [`Source`]:
//! a fixed server, or the master the Sentinels name at each (re)connect;
//! with Sentinel it also moves (waking everyone) as soon as the provider's
//! commands found another master, even while its own connection stands (to
//! a frozen master, say). The connection is opened at the first
//! wait and then kept, so waits that come and go cost no reconnects. A
//! channel stays subscribed for [`LINGER`] after its last waiter left, so
//! a lock that is contended again and again costs no `SUBSCRIBE` /
//! `UNSUBSCRIBE` per wait, and a waiter can see (through
//! [`Subscriber::is_live`]) that it need not try again once subscribed.
//! Waiters never depend on it alone: they also re-check at the holder's
//! expiry and at a bounded interval.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, Notify};

/// What a subscription listens for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// Any message not addressed to a waiter id: one plain waiter wakes.
    Plain,
    /// Only `to:<id>` messages for this id (one copy, shared with the
    /// waiter's queue entry and the actor's map).
    Id(Arc<str>),
    /// Every message (observer number, unique per subscriber).
    Observer(u64),
}

/// Where the subscriber connects.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// Always this server.
    Fixed(Box<redis::Client>),
    /// The master the Sentinels name, asked again at each (re)connect.
    Sentinel(Arc<crate::net::sentinel::Resolver>),
    /// Any node of a Redis Cluster (classic pub/sub is broadcast to every
    /// node): the seed at `at`, and the next seed after a failure, so a
    /// dead, frozen or silent seed is not asked again and again.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Seeds {
        /// One client per seed node, in the order given.
        clients: Vec<redis::Client>,
        /// The seed connected to (or tried next).
        at: usize,
    },
}

impl Source {
    async fn client(&self) -> redis::RedisResult<redis::Client> {
        match self {
            Source::Fixed(client) => Ok((**client).clone()),
            Source::Sentinel(resolver) => resolver.master_client().await,
            Source::Seeds { clients, at } => Ok(clients[*at % clients.len()].clone()),
        }
    }

    /// The connection to the current server failed or went silent: a
    /// cluster's subscriber moves on to its next seed (a fixed server, or
    /// the master Sentinel names, is asked again).
    fn failed(&mut self) {
        if let Source::Seeds { at, .. } = self {
            *at = at.wrapping_add(1);
        }
    }

    /// Resolves with the new master's address each time the master found
    /// through Sentinel changes; never for a fixed server.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<Option<String>>> {
        match self {
            Source::Fixed(_) | Source::Seeds { .. } => None,
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

/// The longest interval between two health checks (`PING` on the
/// subscribed connection) while a channel is subscribed.
pub(crate) const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// The subscriber's clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Bound of a connect (with its resubscription).
    pub(crate) timeout: Duration,
    /// Interval between health checks while a channel is subscribed.
    pub(crate) health_every: Duration,
    /// How long the answer to a health check, a `SUBSCRIBE` or an
    /// `UNSUBSCRIBE` on the open connection may take.
    pub(crate) answer_within: Duration,
}

impl Timing {
    /// The clocks of a provider with `options`: connects within the connect
    /// timeout (or the response timeout, if longer), a health check every
    /// re-check interval (at most [`HEALTH_CHECK`]) answered within the
    /// response timeout.
    pub(crate) fn of(options: &crate::options::RedisOptions) -> Timing {
        Timing {
            timeout: options.response_timeout.max(options.connect_timeout),
            health_every: options.recheck_interval.min(HEALTH_CHECK),
            answer_within: options.response_timeout,
        }
    }

    /// How long an answer of the connection vouches for it: until the next
    /// health check's answer is due.
    fn vouches(&self) -> Duration {
        self.health_every + self.answer_within
    }
}

/// The payload prefix of a message addressed to one waiter.
pub(crate) const ADDRESSED: &str = "to:";

/// The payload prefix of a turn: a release left the plain mutex free for
/// clients outside its line; `turn:<ms>[:<provider id>]` asks this
/// version's waiters to hold back that long, and wakes one plain waiter of
/// the provider named (of each provider, when none is) to ask then (see
/// `mutex_release.lua`). Earlier versions take it as a plain wake-up.
pub(crate) const TURN: &str = "turn:";

/// The longest hold-back a `turn:` message is trusted with (a message from
/// anyone who can publish on the channel must not stall waiters).
const TURN_AT_MOST: Duration = Duration::from_millis(50);

/// How long a channel stays subscribed after its last waiter left.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// What the handles and the actor share, read by waiters without asking
/// the actor: per channel, the plain waiters of this provider (counted by
/// the handles as they come and go) and whether the server confirmed the
/// subscription on the current connection (kept by the actor).
#[derive(Debug, Default)]
struct Board {
    channels: Mutex<HashMap<String, (usize, bool)>>,
    /// Until when the current connection is known to deliver: its last
    /// answer (connect, `SUBSCRIBE`, `PING`) plus a health-check interval
    /// and a response timeout, the latest the next check's answer is due.
    /// `None` while there is no connection.
    healthy_until: Mutex<Option<tokio::time::Instant>>,
    /// Per channel, until when this provider's plain waiters hold back (a
    /// turn for clients outside the line); entries go once passed.
    turns: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Whether `turns` may hold an entry: the hot path reads only this.
    any_turn: AtomicBool,
}

impl Board {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, (usize, bool)>) -> T) -> T {
        f(&mut self.channels.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn plain(&self, channel: &str, delta: isize) {
        self.with(|m| {
            let entry = m.entry(channel.to_owned()).or_default();
            entry.0 = entry.0.saturating_add_signed(delta);
            if *entry == (0, false) {
                m.remove(channel);
            }
        });
    }

    fn set_live(&self, channel: &str, live: bool) {
        self.with(|m| {
            if live {
                m.entry(channel.to_owned()).or_default().1 = true;
            } else if let Some(entry) = m.get_mut(channel) {
                entry.1 = false;
                if entry.0 == 0 {
                    m.remove(channel);
                }
            }
        });
    }

    fn none_live(&self) {
        self.with(|m| {
            m.retain(|_, e| {
                e.1 = false;
                e.0 > 0
            });
        });
    }

    fn set_healthy_until(&self, until: Option<tokio::time::Instant>) {
        *self
            .healthy_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = until;
    }

    fn healthy_until(&self) -> Option<tokio::time::Instant> {
        *self
            .healthy_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn plain_waiters(&self, channel: &str) -> usize {
        self.with(|m| m.get(channel).map_or(0, |e| e.0))
    }

    fn is_live(&self, channel: &str) -> bool {
        self.with(|m| m.get(channel).is_some_and(|e| e.1))
    }

    fn hold_back(&self, channel: &str, until: tokio::time::Instant) {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        turns.retain(|_, t| *t > now);
        let entry = turns.entry(channel.to_owned()).or_insert(until);
        *entry = (*entry).max(until);
        self.any_turn.store(true, Ordering::SeqCst);
    }

    fn turn_taken(&self, channel: &str) {
        self.turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(channel);
    }

    fn held_back(&self, channel: &str) -> Option<tokio::time::Instant> {
        if !self.any_turn.load(Ordering::SeqCst) {
            return None;
        }
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        turns.retain(|_, t| *t > now);
        if turns.is_empty() {
            self.any_turn.store(false, Ordering::SeqCst);
        }
        turns.get(channel).copied()
    }
}

enum Command {
    Subscribe {
        channel: String,
        kind: Kind,
        reply: oneshot::Sender<Arc<Notify>>,
    },
    Unsubscribe(String, Kind),
    /// The last plain waiter on this channel left the line (counted as
    /// outstanding work already): passed on after the commands before it,
    /// its waiter's unsubscribe among them, so the wake-up the pass may
    /// publish is not given to that waiter.
    Leave(String),
    /// This provider's place in the channel's line is gone while its plain
    /// waiters wait (it expired: a refresh came late): one of them is woken
    /// to look again, and its attempt queues the provider again.
    Recheck(String),
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
    /// Places in lines kept alive after a health check: script calls the
    /// line task made (counted once answered, or failed).
    pub(crate) refreshes: AtomicU64,
}

/// The handle waiters use; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Subscriber {
    tx: mpsc::UnboundedSender<Command>,
    pub(crate) stats: Arc<Stats>,
    observers: Arc<AtomicU64>,
    /// Set by the provider's `close()` before it wakes its waiters: their
    /// leaves then go straight to the pass task, not behind the actor's
    /// work (a reconnect may keep it busy for a connect timeout).
    closing: Arc<std::sync::atomic::AtomicBool>,
    board: Arc<Board>,
    id: Arc<str>,
    unclaimed: Arc<Mutex<Option<mpsc::UnboundedReceiver<LineWork>>>>,
    refreshes: Arc<Mutex<Option<Refreshes>>>,
    /// Where unclaimed hand-overs and line leaves go (see
    /// [`Subscriber::take_unclaimed`]).
    passes: Passes,
    /// What `close()` lets finish before the connection goes.
    pub(crate) outstanding: Arc<Outstanding>,
}

/// Work a provider's `close()` lets finish before its command connection
/// goes: acquisitions that may have put the provider in a line or a
/// queue, and the leaves they asked for. Counted up when it starts, down
/// when it is over.
#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    count: AtomicUsize,
    idle: Notify,
}

impl Outstanding {
    /// One more piece of work.
    pub(crate) fn enter(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// One piece of work is over.
    pub(crate) fn exit(&self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until no work is left, for at most `within`.
    pub(crate) async fn drained(&self, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return;
            }
        }
    }
}

/// What the subscriber asks of the provider's line task (which has the
/// command connection) for a plain mutex's line, by release channel.
#[derive(Debug)]
pub(crate) enum LineWork {
    /// Leave the line, passing on a reservation made for this provider
    /// (`mutex_pass.lua`): [`Outstanding`] work until done.
    Pass(String),
}

/// Places in lines to keep alive (`line_alive.lua`), by release channel,
/// each with the instant until which the pub/sub connection's last answer
/// vouches for this provider: set at each answered health check while
/// plain waiters of this provider wait on the channel. Coalesced: a line
/// has at most one pending refresh (the latest deadline), so a slow
/// command connection never queues them up, and they never delay a leave
/// (those go through [`LineWork`]). The receiving side, taken once by the
/// provider's refresh task.
#[derive(Debug)]
pub(crate) struct Refreshes {
    pending: Arc<Mutex<HashMap<String, tokio::time::Instant>>>,
    wake: mpsc::Receiver<()>,
}

impl Refreshes {
    /// Waits for refreshes and takes every pending one; `None` once the
    /// subscriber is gone.
    pub(crate) async fn next(&mut self) -> Option<Vec<(String, tokio::time::Instant)>> {
        self.wake.recv().await?;
        Some(
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .drain()
                .collect(),
        )
    }
}

/// The sending side of the line work: each pass sent is [`Outstanding`]
/// work until the provider's line task is done with it.
#[derive(Clone, Debug)]
struct Passes {
    tx: mpsc::UnboundedSender<LineWork>,
    outstanding: Arc<Outstanding>,
    /// Set once the receiver was taken: a provider without a line task
    /// (Redlock's masters) is sent no refreshes.
    taken: Arc<std::sync::atomic::AtomicBool>,
    /// Pending refreshes (see [`Refreshes`]) and the wake-up of their task.
    pending: Arc<Mutex<HashMap<String, tokio::time::Instant>>>,
    wake: mpsc::Sender<()>,
}

impl Passes {
    fn send(&self, channel: String) {
        self.outstanding.enter();
        self.forward(channel);
    }

    /// Sends a pass counted as outstanding already.
    fn forward(&self, channel: String) {
        if self.tx.send(LineWork::Pass(channel)).is_err() {
            // No line task (the provider is gone): nothing to wait for.
            self.outstanding.exit();
        }
    }

    /// Asks for this provider's place in `channel`'s line to be kept
    /// alive until `until`, replacing a refresh still pending for it.
    fn refresh(&self, channel: String, until: tokio::time::Instant) {
        if self.taken.load(Ordering::Relaxed) {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(channel, until);
            // Full: a wake-up is pending already, and takes this one too.
            let _ = self.wake.try_send(());
        }
    }
}

/// A waiter's interest in one channel; unsubscribes when dropped.
///
/// It exists from the moment the subscribe command is sent, so a waiter
/// cancelled while waiting for the actor's answer still unsubscribes: every
/// subscribe command is matched by exactly one unsubscribe. Nobody waits
/// for the actor's answer apart from its [`Subscription::changed`]: a
/// waiter keeps its own timers (and the caller's deadline) while the
/// server takes its time to confirm the `SUBSCRIBE`.
pub(crate) struct Subscription {
    channel: String,
    kind: Kind,
    wake: Option<Arc<Notify>>,
    /// The actor's answer, until it came.
    answer: Option<oneshot::Receiver<Arc<Notify>>>,
    /// Whether the answer counts as a wake-up ([`Subscription::changed`]
    /// resolves with `false` on it): a waiter that subscribed after its
    /// attempt looks again once subscribed, so a release in between is not
    /// missed.
    recheck_when_ready: bool,
    tx: mpsc::UnboundedSender<Command>,
    sent: bool,
    /// Set for a plain waiter, counted on the board while it lives.
    board: Option<Arc<Board>>,
}

impl Subscription {
    /// Resolves when this waiter is woken: `true` for a release message or
    /// a reconnect that may have lost one, `false` when the subscription
    /// has just taken effect and it was made with a re-check then (see
    /// [`Subscriber::subscribe`]). Pends forever if the subscriber is gone,
    /// leaving waiters to their timers. Cancel-safe.
    pub(crate) async fn changed(&mut self) -> bool {
        if let Some(answer) = &mut self.answer {
            let answered = answer.await.ok();
            self.answer = None;
            self.wake = answered;
            if self.wake.is_some() && self.recheck_when_ready {
                return false;
            }
        }
        match &self.wake {
            Some(wake) => {
                wake.notified().await;
                distlock_core::backend::woke();
                true
            }
            None => std::future::pending().await,
        }
    }

    /// Resolves once the actor registered the subscription (or is gone).
    pub(crate) async fn ready(&mut self) {
        if let Some(answer) = &mut self.answer {
            self.wake = answer.await.ok();
            self.answer = None;
        }
    }

    /// Wakes one other plain waiter of this provider on this channel (one
    /// that may have missed its turn in the line), if it registered.
    pub(crate) fn nudge(&self) {
        if let Some(wake) = &self.wake {
            wake.notify_one();
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(board) = &self.board {
            board.plain(&self.channel, -1);
        }
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
    pub(crate) fn spawn(client: Source, timing: Timing) -> Subscriber {
        let (tx, rx) = mpsc::unbounded_channel();
        let (unclaimed_tx, unclaimed_rx) = mpsc::unbounded_channel();
        let (wake_tx, wake_rx) = mpsc::channel(1);
        let outstanding = Arc::new(Outstanding::default());
        let pending = Arc::new(Mutex::new(HashMap::new()));
        let refreshes = Refreshes {
            pending: Arc::clone(&pending),
            wake: wake_rx,
        };
        let passes = Passes {
            tx: unclaimed_tx,
            outstanding: Arc::clone(&outstanding),
            taken: Arc::default(),
            pending,
            wake: wake_tx,
        };
        let stats = Arc::new(Stats::default());
        let board = Arc::new(Board::default());
        let id: Arc<str> = Arc::from(format!("p{}", uuid::Uuid::new_v4().simple()));
        tokio::spawn(run(
            client,
            timing,
            rx,
            Arc::clone(&stats),
            Arc::clone(&board),
            Arc::clone(&id),
            passes.clone(),
        ));
        Subscriber {
            tx,
            stats,
            observers: Arc::new(AtomicU64::new(0)),
            closing: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            board,
            id,
            unclaimed: Arc::new(Mutex::new(Some(unclaimed_rx))),
            refreshes: Arc::new(Mutex::new(Some(refreshes))),
            passes,
            outstanding,
        }
    }

    /// This provider's id in a plain mutex's line (`p` and 32 hex digits).
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The channels of unclaimed hand-overs and line leaves (see the module
    /// docs), once: the provider passes them on, and calls
    /// [`Outstanding::exit`] on [`Subscriber::outstanding`] once done with
    /// each.
    pub(crate) fn take_unclaimed(&self) -> Option<mpsc::UnboundedReceiver<LineWork>> {
        self.passes.taken.store(true, Ordering::Relaxed);
        self.unclaimed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The refreshes of this provider's places in lines (see
    /// [`Refreshes`]), once: taken with [`Subscriber::take_unclaimed`] by
    /// the provider, which runs them.
    pub(crate) fn take_refreshes(&self) -> Option<Refreshes> {
        self.refreshes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Wakes one plain waiter of this provider on `channel` to look again
    /// (see `Command::Recheck`).
    pub(crate) fn recheck(&self, channel: &str) {
        let _ = self.tx.send(Command::Recheck(channel.to_owned()));
    }

    /// Announces an unclaimed hand-over on `channel` (a waiter that left
    /// the line): the provider passes it on.
    pub(crate) fn leave_line(&self, channel: &str) {
        // Through the actor (see `Command::Leave`), then the same path as
        // the actor's own: the receiver runs the pass script. `close()`
        // waits for it before it shuts the actor down.
        self.outstanding.enter();
        if self.closing.load(Ordering::SeqCst) {
            // Every waiter here is ending: no wake-up to keep from them.
            self.passes.forward(channel.to_owned());
        } else if self.tx.send(Command::Leave(channel.to_owned())).is_err() {
            // The actor has ended: pass it on directly.
            self.passes.forward(channel.to_owned());
        }
    }

    /// The provider is closing: line leaves from now on skip the actor.
    pub(crate) fn closing(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// How many plain waiters of this provider wait on `channel` now.
    pub(crate) fn plain_waiters(&self, channel: &str) -> usize {
        self.board.plain_waiters(channel)
    }

    /// This provider's plain waiters on `channel` hold back for `turn`: a
    /// release left the lock free for clients outside the line.
    pub(crate) fn hold_back(&self, channel: &str, turn: Duration) {
        let turn = turn.min(TURN_AT_MOST);
        self.board
            .hold_back(channel, tokio::time::Instant::now() + turn);
    }

    /// The turn on `channel` was taken (the lock key changed): this
    /// provider's waiters hold back no longer.
    pub(crate) fn turn_taken(&self, channel: &str) {
        self.board.turn_taken(channel);
    }

    /// Until when this provider's plain waiters on `channel` hold back,
    /// if they do now (no lock taken on the way while nobody holds back).
    pub(crate) fn held_back(&self, channel: &str) -> Option<tokio::time::Instant> {
        self.board.held_back(channel)
    }

    /// Whether `channel` is subscribed on the current connection (waiters
    /// or lingering), so a waiter registered now hears every later message.
    pub(crate) fn is_live(&self, channel: &str) -> bool {
        self.board.is_live(channel)
    }

    /// Starts a plain subscription without waiting for the actor: the
    /// command is queued before the caller's next request to the server,
    /// and the actor handles commands before messages, so on a live
    /// channel ([`Self::is_live`]) every message caused by that request
    /// finds the waiter counted; the actor's answer is not a wake-up.
    pub(crate) fn start_subscribe(&self, channel: String) -> Subscription {
        self.new_subscription(channel, Kind::Plain, false)
    }

    /// Ends the actor and its connection (the provider was closed); later
    /// subscriptions pend, leaving waiters to their timers and the closed
    /// signal.
    pub(crate) fn shut_down(&self) {
        let _ = self.tx.send(Command::ShutDown);
    }

    /// Registers interest in `channel` without waiting: the subscription's
    /// first [`Subscription::changed`] resolves (`false`) once the server
    /// confirmed it, for the waiter to look again (or never, if the attempt
    /// failed: the waiter then relies on its timers).
    pub(crate) fn subscribe(&self, channel: String) -> Subscription {
        self.new_subscription(channel, Kind::Plain, true)
    }

    /// Registers a waiter known by `id` on `channel`, as
    /// [`Subscriber::subscribe`]: it is woken only by a `to:<id>` message
    /// (and by a reconnect), and a wake-up that comes while it is not
    /// waiting is kept for its next [`Subscription::changed`].
    pub(crate) fn subscribe_as(&self, channel: String, id: Arc<str>) -> Subscription {
        self.new_subscription(channel, Kind::Id(id), true)
    }

    /// Registers an observer of `channel`, as [`Subscriber::subscribe`]:
    /// woken by every message (and by a reconnect); wake-ups not consumed
    /// yet coalesce into one.
    pub(crate) fn observe(&self, channel: String) -> Subscription {
        let n = self.observers.fetch_add(1, Ordering::Relaxed);
        self.new_subscription(channel, Kind::Observer(n), true)
    }

    /// How long from now this provider can be counted on to hear a
    /// hand-over on `channel`: zero unless the channel is subscribed on a
    /// connection that answered its last health check in time; otherwise
    /// until that connection's next answer is due. A plain waiter's attempt
    /// keeps its provider's place in the line alive for that long.
    pub(crate) fn alive_for(&self, channel: &str) -> Duration {
        if !self.board.is_live(channel) {
            return Duration::ZERO;
        }
        self.board.healthy_until().map_or(Duration::ZERO, |until| {
            until.saturating_duration_since(tokio::time::Instant::now())
        })
    }

    fn new_subscription(&self, channel: String, kind: Kind, recheck: bool) -> Subscription {
        let (reply, answer) = oneshot::channel();
        let board = (kind == Kind::Plain).then(|| {
            self.board.plain(&channel, 1);
            Arc::clone(&self.board)
        });
        let mut subscription = Subscription {
            channel: channel.clone(),
            kind: kind.clone(),
            wake: None,
            answer: Some(answer),
            recheck_when_ready: recheck,
            tx: self.tx.clone(),
            sent: false,
            board,
        };
        subscription.sent = self
            .tx
            .send(Command::Subscribe {
                channel,
                kind,
                reply,
            })
            .is_ok();
        if !subscription.sent {
            subscription.answer = None;
        }
        subscription
    }
}

struct Channel {
    refs: usize,
    /// Since when nobody uses it (it lingers until [`LINGER`] after).
    idle_since: Option<tokio::time::Instant>,
    /// Plain waiters share one: a message wakes one of them.
    wake: Arc<Notify>,
    /// Waiters by id, each with its own.
    ids: HashMap<Arc<str>, Arc<Notify>>,
    /// Observers, each with its own.
    observers: HashMap<u64, Arc<Notify>>,
}

/// A health check in flight: resolves `true` when answered in time.
type Ping = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

struct Actor {
    client: Source,
    timing: Timing,
    /// The health check in flight on `conn`, if any.
    ping: Option<Ping>,
    /// When the next health check is due.
    next_ping: tokio::time::Instant,
    channels: HashMap<String, Channel>,
    board: Arc<Board>,
    id: Arc<str>,
    unclaimed: Passes,
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
        let opened = tokio::time::timeout(self.timing.timeout, async {
            let client = self.client.client().await?;
            self.connected_to = Some(crate::net::sentinel::address(&client));
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
                self.answered();
                for name in self.channels.keys() {
                    self.board.set_live(name, true);
                }
                // Messages sent while we were away are lost: re-check.
                self.wake_all();
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "distlock redis subscriber cannot connect");
                self.client.failed();
                false
            }
            Err(_) => {
                tracing::debug!("distlock redis subscriber connect timed out");
                self.client.failed();
                false
            }
        }
    }

    /// The connection answered (connected, subscribed, a health check).
    fn answered(&mut self) {
        let now = tokio::time::Instant::now();
        self.next_ping = now + self.timing.health_every;
        self.board
            .set_healthy_until(Some(now + self.timing.vouches()));
    }

    /// Sends a health check on the connection.
    fn start_ping(&mut self) {
        let Some((sink, _)) = &self.conn else {
            return;
        };
        let mut sink = sink.clone();
        let within = self.timing.answer_within;
        self.ping = Some(Box::pin(async move {
            matches!(
                tokio::time::timeout(within, sink.ping::<redis::Value>()).await,
                Ok(Ok(_))
            )
        }));
    }

    /// A health check is over: answered, the places of this provider in
    /// the lines its plain waiters wait in are kept alive; not, the
    /// connection is replaced.
    fn pinged(&mut self, answered: bool) {
        self.ping = None;
        if !answered {
            tracing::debug!("distlock redis subscriber connection does not answer: replacing it");
            self.disconnect();
            return;
        }
        self.answered();
        let until = tokio::time::Instant::now() + self.timing.vouches();
        for name in self.channels.keys() {
            if self.board.plain_waiters(name) > 0 {
                self.unclaimed.refresh(name.clone(), until);
            }
        }
    }

    fn disconnect(&mut self) {
        self.ping = None;
        self.board.set_healthy_until(None);
        self.board.none_live();
        if self.conn.take().is_some() {
            tracing::debug!("distlock redis subscriber lost its connection");
            self.client.failed();
        }
        self.wake_all();
    }

    async fn subscribe(&mut self, channel: String, kind: Kind) -> Arc<Notify> {
        let entry = self
            .channels
            .entry(channel.clone())
            .or_insert_with(|| Channel {
                refs: 0,
                idle_since: None,
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
        entry.idle_since = None;
        // In use already, or lingering and subscribed on this connection.
        if entry.refs > 1 || self.board.is_live(&channel) {
            return rx;
        }
        if self.conn.is_none() {
            // Connecting subscribes every channel, this one included.
            self.connect().await;
            return rx;
        }
        if let Some((sink, _)) = &mut self.conn {
            // A command on an open connection: answered within the
            // response timeout, or the connection is silent.
            let ok =
                tokio::time::timeout(self.timing.answer_within, sink.subscribe(&channel)).await;
            if matches!(ok, Ok(Ok(()))) {
                self.board.set_live(&channel, true);
                self.answered();
            } else {
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
        if entry.refs == 0 {
            // Lingers: waiters on this lock may well come back.
            entry.idle_since = Some(tokio::time::Instant::now());
        }
    }

    /// When the next lingering channel is due to go.
    fn next_sweep(&self) -> Option<tokio::time::Instant> {
        self.channels
            .values()
            .filter_map(|c| c.idle_since)
            .min()
            .map(|since| since + LINGER)
    }

    /// Unsubscribes the channels idle for [`LINGER`].
    async fn sweep(&mut self) {
        let now = tokio::time::Instant::now();
        let gone: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, c)| c.idle_since.is_some_and(|s| s + LINGER <= now))
            .map(|(name, _)| name.clone())
            .collect();
        for channel in gone {
            self.channels.remove(&channel);
            self.board.set_live(&channel, false);
            if let Some((sink, _)) = &mut self.conn {
                let ok =
                    tokio::time::timeout(self.timing.answer_within, sink.unsubscribe(&channel))
                        .await;
                if !matches!(ok, Ok(Ok(()))) {
                    self.disconnect();
                }
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
            } else if id == &*self.id {
                // The plain mutex's hand-over to this provider: one of its
                // plain waiters, or nobody left to claim it.
                if self.board.plain_waiters(msg.get_channel_name()) > 0 {
                    self.stats.messages.fetch_add(1, Ordering::Relaxed);
                    ch.wake.notify_one();
                } else {
                    self.unclaimed.send(msg.get_channel_name().to_owned());
                }
            }
            return;
        }
        if let Some(turn) = payload.strip_prefix(TURN) {
            // A turn: every waiter holds back; the one woken below (of the
            // provider named, if one is) asks once it is over.
            let (ms, to) = match turn.split_once(':') {
                Some((ms, to)) => (ms, Some(to)),
                None => (turn, None),
            };
            if let Ok(ms) = ms.parse::<u64>() {
                self.board.hold_back(
                    msg.get_channel_name(),
                    tokio::time::Instant::now() + Duration::from_millis(ms).min(TURN_AT_MOST),
                );
            }
            if to.is_some_and(|to| to != &*self.id) {
                return;
            }
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

async fn ping_done(ping: &mut Option<Ping>) -> bool {
    match ping {
        Some(ping) => ping.await,
        None => std::future::pending().await,
    }
}

async fn run(
    client: Source,
    timing: Timing,
    mut commands: mpsc::UnboundedReceiver<Command>,
    stats: Arc<Stats>,
    board: Arc<Board>,
    id: Arc<str>,
    unclaimed: Passes,
) {
    let mut actor = Actor {
        client,
        timing,
        ping: None,
        next_ping: tokio::time::Instant::now(),
        channels: HashMap::new(),
        board,
        id,
        unclaimed,
        conn: None,
        connected_to: None,
        stats,
    };
    let mut changes = actor.client.changes();
    let mut backoff = Duration::from_millis(50);
    loop {
        let reconnect = actor.conn.is_none() && actor.channels.values().any(|c| c.refs > 0);
        let sweep = actor.next_sweep();
        // Health checks while any channel is subscribed (waited on, or
        // lingering): a silent connection is found and replaced.
        let check = actor.conn.is_some() && actor.ping.is_none() && !actor.channels.is_empty();
        tokio::select! {
            // Commands first: a waiter's subscription queued before its
            // request to the server is counted before any message that
            // request causes (see `Subscriber::start_subscribe`).
            biased;
            command = commands.recv() => match command {
                None => return,
                Some(Command::ShutDown) => {
                    // Leaves queued behind it still reach the pass task;
                    // closed first, so a leave sent meanwhile is refused
                    // (and goes there directly) rather than dropped unread.
                    commands.close();
                    while let Ok(command) = commands.try_recv() {
                        if let Command::Leave(channel) = command {
                            actor.unclaimed.forward(channel);
                        }
                    }
                    return;
                }
                Some(Command::Subscribe { channel, kind, reply }) => {
                    let wake = actor.subscribe(channel, kind).await;
                    // A waiter cancelled meanwhile unsubscribes on its own.
                    let _ = reply.send(wake);
                }
                Some(Command::Unsubscribe(channel, kind)) => {
                    actor.unsubscribe(channel, kind).await;
                }
                Some(Command::Leave(channel)) => actor.unclaimed.forward(channel),
                Some(Command::Recheck(channel)) => {
                    if let Some(ch) = actor.channels.get(&channel) {
                        // A permit if none waits at this moment: the next
                        // to wait looks again at once.
                        ch.wake.notify_one();
                    }
                }
            },
            msg = next_message(&mut actor.conn) => match msg {
                Some(msg) => {
                    actor.deliver(&msg);
                    // A message read after the health check was sent shows
                    // the connection delivers: it answers the check (whose
                    // reply may wait in the socket behind a flood of them).
                    if actor.ping.is_some() {
                        actor.pinged(true);
                    }
                }
                None => actor.disconnect(),
            },
            // The commands found another master (a failover while this
            // connection still stands, to a frozen or demoted server): move.
            master = master_changed(&mut changes) => {
                if actor.conn.is_some() && master.is_some() && master != actor.connected_to {
                    actor.disconnect();
                }
            }
            answered = ping_done(&mut actor.ping) => actor.pinged(answered),
            () = tokio::time::sleep_until(actor.next_ping), if check => actor.start_ping(),
            () = tokio::time::sleep_until(sweep.unwrap_or_else(tokio::time::Instant::now)), if sweep.is_some() => {
                actor.sweep().await;
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
