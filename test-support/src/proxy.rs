//! A loopback TCP proxy for fault tests: add delay, cut every connection,
//! blackhole traffic. It runs on a runtime of its own, so it keeps working
//! whatever the test's runtime does.

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

    /// Closes every open connection now; new ones are still accepted.
    pub fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// Connections open right now.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.control.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since the start.
    #[must_use]
    pub fn accepted_connections(&self) -> usize {
        self.control.accepted.load(Ordering::SeqCst)
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
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            control.open.fetch_add(1, Ordering::SeqCst);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::select! {
                () = pump(cr, sw, &control) => {}
                () = pump(sr, cw, &control) => {}
                _ = cut.changed() => {}
            }
            control.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Copies one direction, applying delay and blackhole; returns when either
/// side closes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    control: &Control,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = control.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        if control.blackhole.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
