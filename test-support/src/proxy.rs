//! A loopback TCP proxy for fault tests: add delay, cut every connection,
//! blackhole traffic, lose the reply to a request that reached the server.
//! It runs on a runtime of its own, so it keeps working whatever the test's
//! runtime does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Default)]
struct Control {
    delay_us: AtomicU64,
    blackhole: AtomicBool,
    open: AtomicUsize,
    accepted: AtomicUsize,
    /// Bumped by every `cut()`; a connection remembers the generation it
    /// was accepted in.
    generation: AtomicU64,
    /// `lose_next_reply()` is armed and no request has been forwarded since.
    lose_next: AtomicBool,
    /// Armed by `lose_reply_to(marker)`: only a request chunk containing the
    /// marker arms the swallowing, after `skip` such chunks went through.
    lose_marker: std::sync::Mutex<Option<(Vec<u8>, usize)>>,
    /// 0: replies flow. `g + 1`: server-to-client bytes of connections of
    /// generation `g` or older are swallowed (a reply was lost in `g`).
    swallow: AtomicU64,
    swallowed_bytes: AtomicU64,
    /// The connections accepted so far (dead ones are pruned at accept).
    conns: std::sync::Mutex<Vec<std::sync::Weak<Conn>>>,
    /// Armed by `reset_after_request(marker)`: the connection that
    /// forwards a request chunk containing the marker (after `skip` such
    /// chunks went through) is then reset on the client's side.
    reset_marker: std::sync::Mutex<Option<(Vec<u8>, usize)>>,
    /// The armed reset drops the request instead of forwarding it
    /// (`reset_instead_of_request`).
    reset_drops: AtomicBool,
    /// Client connections reset by `reset_after_request`.
    resets: AtomicUsize,
    /// Connections accepted while set start muted
    /// (`mute_replies_of_new_connections`).
    mute_new: AtomicBool,
}

/// How long the server side of a connection reset by
/// [`Proxy::reset_after_request`] stays open: time for the server to run
/// the forwarded request (its reply is dropped).
const RESET_SERVER_LINGER: Duration = Duration::from_millis(500);

/// What the proxy keeps about one connection.
#[derive(Debug, Default)]
struct Conn {
    /// The first bytes the client sent (up to [`OPENING`]).
    opening: std::sync::Mutex<Vec<u8>>,
    /// Every byte is swallowed, both ways, until the connection closes.
    silenced: AtomicBool,
    /// Every byte towards the client is swallowed (requests still reach
    /// the server), until the connection closes.
    muted: AtomicBool,
}

/// How much of what a client sends first a connection remembers.
const OPENING: usize = 4096;

impl Control {
    fn swallows(&self, generation: u64) -> bool {
        match self.swallow.load(Ordering::SeqCst) {
            0 => false,
            armed_in => generation < armed_in,
        }
    }
}

/// A TCP proxy on 127.0.0.1 forwarding to one loopback target.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    control: Arc<Control>,
    cut: watch::Sender<u64>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// Starts a proxy to `target`, which must be a loopback address.
    ///
    /// # Panics
    ///
    /// When `target` is not on 127.0.0.0/8 or `[::1]` (fault tests never
    /// leave the machine), or no port can be bound.
    #[must_use]
    pub fn start(target: SocketAddr) -> Proxy {
        assert!(
            target.ip().is_loopback(),
            "the proxy only forwards to loopback addresses, not {target}"
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-test-proxy")
            .enable_all()
            .build()
            .expect("proxy runtime");
        // Bound with std, so `start` works inside or outside a runtime.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy on 127.0.0.1");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("proxy address");
        let control = Arc::new(Control::default());
        let (cut, cut_rx) = watch::channel(0u64);
        let accept_control = Arc::clone(&control);
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("tokio listener");
            accept_loop(listener, target, accept_control, cut_rx).await;
        });
        Proxy {
            addr,
            target,
            control,
            cut,
            runtime: Some(runtime),
        }
    }

    /// The proxy's own address: point clients here.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it forwards to.
    #[must_use]
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Delays every chunk of data, both ways, by `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.control.delay_us.store(us, Ordering::SeqCst);
    }

    /// While on, connections stay open (and new ones are accepted) but every
    /// byte is swallowed: a network partition as the peers see it.
    pub fn set_blackhole(&self, on: bool) {
        self.control.blackhole.store(on, Ordering::SeqCst);
    }

    /// Closes every open connection now; new ones are still accepted, and
    /// replies on them flow again after [`Proxy::lose_next_reply`] (the
    /// connections being closed keep swallowing until they are gone).
    pub fn cut(&self) {
        self.control.generation.fetch_add(1, Ordering::SeqCst);
        self.cut.send_modify(|g| *g += 1);
    }

    /// Arms a one-shot fault: the next chunk any client sends is forwarded
    /// to the server, and from that moment every byte the server sends to
    /// any client (on every connection open then or opened later) is
    /// swallowed, until [`Proxy::cut`] or [`Proxy::heal`]. The request lands;
    /// its reply never arrives: the client cannot tell whether it took
    /// effect.
    ///
    /// "The next chunk" is whatever a client writes first, on any
    /// connection: quiesce other traffic (watchdogs, pings) if the test needs
    /// one particular request to be the one. Bytes the server sent just
    /// before, still in flight inside the proxy, may be swallowed too.
    pub fn lose_next_reply(&self) {
        self.control.lose_next.store(true, Ordering::SeqCst);
    }

    /// As [`Proxy::lose_next_reply`], but only for the next request chunk
    /// that contains `marker` (a command name, say `EVALSHA`): requests
    /// before it (a pool's health check, a ping) pass untouched.
    pub fn lose_reply_to(&self, marker: &[u8]) {
        self.lose_reply_to_nth(marker, 0);
    }

    /// As [`Proxy::lose_reply_to`], letting the first `skip` requests that
    /// contain `marker` through untouched (say, the read before a delete).
    pub fn lose_reply_to_nth(&self, marker: &[u8], skip: usize) {
        *self
            .control
            .lose_marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((marker.to_vec(), skip));
    }

    /// Whether a request armed by [`Proxy::lose_next_reply`] has been
    /// forwarded and replies are being swallowed now (no cut or heal since).
    #[must_use]
    pub fn losing_replies(&self) -> bool {
        self.control
            .swallows(self.control.generation.load(Ordering::SeqCst))
    }

    /// Server-to-client bytes swallowed after [`Proxy::lose_next_reply`]
    /// since the start.
    #[must_use]
    pub fn swallowed_bytes(&self) -> u64 {
        self.control.swallowed_bytes.load(Ordering::SeqCst)
    }

    /// Waits, at most `within`, until some reply bytes were swallowed
    /// (see [`Proxy::swallowed_bytes`]); whether they were. The server
    /// runs a request a moment before its reply reaches the proxy, so a
    /// test that has seen a request's effect on the server asks this
    /// rather than reading the count at once.
    pub async fn swallowed_some(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.swallowed_bytes() == 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Back to plain forwarding: no blackhole, no delay, no swallowed
    /// replies, and a pending [`Proxy::lose_next_reply`] or
    /// [`Proxy::reset_after_request`] disarmed. Open
    /// connections stay open.
    pub fn heal(&self) {
        self.control.lose_next.store(false, Ordering::SeqCst);
        *self
            .control
            .reset_marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        *self
            .control
            .lose_marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.control.swallow.store(0, Ordering::SeqCst);
        self.control.blackhole.store(false, Ordering::SeqCst);
        self.control.delay_us.store(0, Ordering::SeqCst);
    }

    /// Arms a one-shot fault: the next request chunk any client sends that
    /// contains `marker` is forwarded to the server, and right after, that
    /// client's connection is reset (an RST, so the client reads
    /// `ECONNRESET`, not an end of file). The server side stays open a
    /// moment, so the request runs; its reply is dropped. The client cannot
    /// tell whether the request took effect. Other connections, and later
    /// ones, are not touched.
    pub fn reset_after_request(&self, marker: &[u8]) {
        self.reset_after_nth_request(marker, 0);
    }

    /// As [`Proxy::reset_after_request`], letting the first `skip` request
    /// chunks that contain `marker` through untouched.
    pub fn reset_after_nth_request(&self, marker: &[u8], skip: usize) {
        self.control.reset_drops.store(false, Ordering::SeqCst);
        *self
            .control
            .reset_marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((marker.to_vec(), skip));
    }

    /// As [`Proxy::reset_after_request`], but the request chunk is dropped,
    /// not forwarded: the request never reaches the server, and the client
    /// sees a reset all the same (it cannot tell the two apart).
    pub fn reset_instead_of_request(&self, marker: &[u8]) {
        self.control.reset_drops.store(true, Ordering::SeqCst);
        *self
            .control
            .reset_marker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((marker.to_vec(), 0));
    }

    /// Client connections reset by [`Proxy::reset_after_request`] (or
    /// [`Proxy::reset_instead_of_request`]) so far.
    #[must_use]
    pub fn resets(&self) -> usize {
        self.control.resets.load(Ordering::SeqCst)
    }

    /// Connections open right now.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.control.open.load(Ordering::SeqCst)
    }

    /// Waits until no connection is open through the proxy (a client closed
    /// its connections or session).
    ///
    /// # Panics
    ///
    /// When some are still open after `within`, naming `what`.
    pub async fn wait_closed(&self, within: Duration, what: &str) {
        let deadline = std::time::Instant::now() + within;
        while self.open_connections() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {} connections still open",
                self.open_connections()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Connections accepted since the start.
    #[must_use]
    pub fn accepted_connections(&self) -> usize {
        self.control.accepted.load(Ordering::SeqCst)
    }

    /// Silences the connections open now whose client sent `marker` among
    /// the first 4 KiB the proxy has read from it (say `TRACKING`, to pick
    /// a connection by the setup command it sent): they stay open, but
    /// every byte read from then on is swallowed both ways (a chunk being
    /// written at that moment still passes), as if only that connection
    /// were partitioned; a close still goes through. Other connections,
    /// and those opened later, are not touched (nor is a silenced
    /// connection by [`Proxy::heal`]; [`Proxy::cut`] closes it). Returns
    /// how many were silenced.
    pub fn silence_connections_that_sent(&self, marker: &[u8]) -> usize {
        self.flag_connections_that_sent(marker, |conn| &conn.silenced)
    }

    /// As [`Proxy::silence_connections_that_sent`], but one way only: the
    /// requests of those connections still reach the server (and run),
    /// while every byte the server sends them is swallowed, as on a path
    /// that lost its return direction. Returns how many were muted.
    pub fn mute_replies_of_connections_that_sent(&self, marker: &[u8]) -> usize {
        self.flag_connections_that_sent(marker, |conn| &conn.muted)
    }

    /// As [`Proxy::mute_replies_of_connections_that_sent`], for the
    /// connections that sent every one of `markers` (say a user name from
    /// their `AUTH` and `EVALSHA`, to pick one client's command
    /// connection). Returns how many were muted.
    pub fn mute_replies_of_connections_that_sent_all(&self, markers: &[&[u8]]) -> usize {
        self.flag_connections_that_sent_all(markers, |conn| &conn.muted)
    }

    /// While `on`, every connection accepted from now on is muted as by
    /// [`Proxy::mute_replies_of_connections_that_sent`] from its first
    /// byte: a return path that stays deaf across reconnects (connections
    /// open now are not touched; nor is a muted connection by
    /// [`Proxy::heal`]).
    pub fn mute_replies_of_new_connections(&self, on: bool) {
        self.control.mute_new.store(on, Ordering::SeqCst);
    }

    /// Sets the flag `pick` chooses on the connections open now whose
    /// client sent `marker` among its first 4 KiB; returns how many.
    fn flag_connections_that_sent(&self, marker: &[u8], pick: fn(&Conn) -> &AtomicBool) -> usize {
        self.flag_connections_that_sent_all(&[marker], pick)
    }

    /// As [`Proxy::flag_connections_that_sent`], for the connections that
    /// sent every one of `markers` (none: none).
    fn flag_connections_that_sent_all(
        &self,
        markers: &[&[u8]],
        pick: fn(&Conn) -> &AtomicBool,
    ) -> usize {
        if markers.is_empty() || markers.iter().any(|m| m.is_empty()) {
            return 0;
        }
        let conns = self
            .control
            .conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut flagged = 0;
        for conn in conns.iter().filter_map(std::sync::Weak::upgrade) {
            let sent = {
                let opening = conn
                    .opening
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                markers
                    .iter()
                    .all(|m| opening.windows(m.len()).any(|w| w == *m))
            };
            if sent {
                pick(&conn).store(true, Ordering::SeqCst);
                flagged += 1;
            }
        }
        flagged
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    control: Arc<Control>,
    cut: watch::Receiver<u64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        control.accepted.fetch_add(1, Ordering::SeqCst);
        let control = Arc::clone(&control);
        let mut cut = cut.clone();
        cut.mark_unchanged();
        let generation = control.generation.load(Ordering::SeqCst);
        let conn = Arc::new(Conn::default());
        if control.mute_new.load(Ordering::SeqCst) {
            conn.muted.store(true, Ordering::SeqCst);
        }
        {
            let mut conns = control
                .conns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            conns.retain(|c| c.strong_count() > 0);
            conns.push(Arc::downgrade(&conn));
        }
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            control.open.fetch_add(1, Ordering::SeqCst);
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let reset = tokio::select! {
                reset = pump(&mut cr, &mut sw, &control, &conn, Direction::ToServer) => reset,
                reset = pump(&mut sr, &mut cw, &control, &conn, Direction::ToClient(generation)) => reset,
                _ = cut.changed() => false,
            };
            if reset {
                // An abortive close: RST, without the write half's FIN first.
                if let Ok(client) = cr.reunite(cw) {
                    let _ = client.set_zero_linger();
                    drop(client);
                }
                control.resets.fetch_add(1, Ordering::SeqCst);
                control.open.fetch_sub(1, Ordering::SeqCst);
                // The server runs the request; its reply goes nowhere.
                tokio::time::sleep(RESET_SERVER_LINGER).await;
                drop((sr, sw));
                return;
            }
            control.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Which way a pump copies; towards the client, with the connection's cut
/// generation.
#[derive(Clone, Copy)]
enum Direction {
    ToServer,
    ToClient(u64),
}

/// Copies one direction, applying delay, blackhole, lost replies and
/// resets; returns when either side closes (`false`), or when a request
/// armed by `reset_after_request` was forwarded (`true`: reset the client).
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    control: &Control,
    conn: &Conn,
    direction: Direction,
) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        if matches!(direction, Direction::ToServer) {
            let mut opening = conn
                .opening
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let room = OPENING.saturating_sub(opening.len()).min(n);
            opening.extend_from_slice(&buf[..room]);
        }
        if conn.silenced.load(Ordering::SeqCst) {
            continue;
        }
        let delay = control.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        if control.blackhole.load(Ordering::SeqCst) {
            continue;
        }
        match direction {
            Direction::ToServer => {
                let marked = {
                    let mut marker = control
                        .lose_marker
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let seen = marker.as_ref().is_some_and(|(m, _)| {
                        !m.is_empty() && buf[..n].windows(m.len()).any(|w| w == m)
                    });
                    match marker.as_mut() {
                        Some((_, skip)) if seen && *skip > 0 => {
                            *skip -= 1;
                            false
                        }
                        _ if seen => {
                            *marker = None;
                            true
                        }
                        _ => false,
                    }
                };
                if marked || control.lose_next.swap(false, Ordering::SeqCst) {
                    // Swallow from before the request is written: a reply
                    // the server sends at once cannot slip through.
                    let now = control.generation.load(Ordering::SeqCst);
                    control.swallow.store(now + 1, Ordering::SeqCst);
                }
                if take_marker(&control.reset_marker, &buf[..n]) {
                    // Forwarded (or dropped), then the client's side is
                    // reset at once (before any reply can be copied back).
                    if !control.reset_drops.load(Ordering::SeqCst) {
                        let _ = to.write_all(&buf[..n]).await;
                    }
                    return true;
                }
            }
            Direction::ToClient(generation) => {
                if conn.muted.load(Ordering::SeqCst) {
                    continue;
                }
                if control.swallows(generation) {
                    control
                        .swallowed_bytes
                        .fetch_add(n as u64, Ordering::SeqCst);
                    continue;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return false;
        }
    }
}

/// Whether `chunk` fires the one-shot `marker` (`Some((marker, skip))`):
/// it contains the marker and `skip` is 0 (else `skip` counts down).
fn take_marker(marker: &std::sync::Mutex<Option<(Vec<u8>, usize)>>, chunk: &[u8]) -> bool {
    let mut marker = marker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let seen = marker
        .as_ref()
        .is_some_and(|(m, _)| !m.is_empty() && chunk.windows(m.len()).any(|w| w == m));
    match marker.as_mut() {
        Some((_, skip)) if seen && *skip > 0 => {
            *skip -= 1;
            false
        }
        _ if seen => {
            *marker = None;
            true
        }
        _ => false,
    }
}

/// Starts `lock.lock_timeout(1 s)` while the lock is held elsewhere, then
/// partitions its client (blackhole and cut through `proxy`) 200 ms in: the
/// wait must end within 2.2 s, without the lock and with at most a retryable
/// error, however long the client's reconnection takes. Heals the proxy.
///
/// # Panics
///
/// When the wait overran, acquired, or failed with another error; `what`
/// names the case.
pub async fn wait_keeps_its_deadline_through_a_partition(
    proxy: &Proxy,
    lock: Arc<dyn distlock_core::Lock>,
    what: &str,
) {
    let started = std::time::Instant::now();
    let attempt = tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(1)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_blackhole(true);
    proxy.cut();
    let got = tokio::time::timeout(Duration::from_secs(15), attempt)
        .await
        .unwrap_or_else(|_| panic!("{what}: the wait hung"))
        .expect("the waiting task");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2200),
        "{what}: a 1 s wait took {took:?}"
    );
    match got {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{what}: acquired a held lock"),
        Err(e) => assert!(e.is_retryable(), "{what}: untyped failure: {e:?}"),
    }
    proxy.heal();
}
