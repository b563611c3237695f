//! The provider's ZooKeeper session: one at a time, replaced by a new one
//! when it expires or closes (a zookeeper-client `Client` whose session
//! expired stays dead).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use distlock_core::{Error, Result};
use tokio::sync::watch;
use zookeeper_client::{Client, SessionState};

use crate::error::from_zk;
use crate::options::ZkOptions;

/// The session's state as leases see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Connected,
    Disconnected,
    Expired,
    Closed,
}

impl Status {
    fn from_state(state: SessionState) -> Status {
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => Status::Connected,
            SessionState::Disconnected => Status::Disconnected,
            SessionState::Expired => Status::Expired,
            SessionState::Closed | SessionState::AuthFailed => Status::Closed,
        }
    }

    pub(crate) fn is_dead(self) -> bool {
        matches!(self, Status::Expired | Status::Closed)
    }
}

/// One live session.
pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) status: watch::Receiver<Status>,
    pub(crate) id: i64,
}

impl Session {
    /// Expired or closed. Reads the client's own state too: the state task
    /// may not have published a change yet.
    pub(crate) fn is_dead(&self) -> bool {
        self.status.borrow().is_dead() || Status::from_state(self.client.state()).is_dead()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }
}

/// The current session and how to make the next one.
pub(crate) struct Sessions {
    options: ZkOptions,
    current: RwLock<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<()>,
    closed: std::sync::atomic::AtomicBool,
}

impl Sessions {
    pub(crate) fn new(options: ZkOptions, first: Session) -> Self {
        Sessions {
            options,
            current: RwLock::new(Some(Arc::new(first))),
            connecting: tokio::sync::Mutex::new(()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// No new session from now on; lets go of the current one, which
    /// zookeeper-client closes (a `closeSession` request) once its last
    /// user lets go too. Waits up to `wait` for that.
    pub(crate) async fn close(&self, wait: Duration) {
        let current = {
            let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
            // Under the lock `get` stores a new session with: it sees the
            // flag, or its session is taken here.
            self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            current.take()
        };
        let Some(session) = current else {
            return;
        };
        let mut status = session.status.clone();
        drop(session);
        let _ = tokio::time::timeout(wait, status.wait_for(|s| s.is_dead())).await;
    }

    pub(crate) fn options(&self) -> &ZkOptions {
        &self.options
    }

    fn live(&self) -> Option<Arc<Session>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|s| !s.is_dead())
            .cloned()
    }

    /// Drops `dead` as the current session (an operation found it ended), so
    /// the next [`Sessions::get`] opens a new one; then pauses briefly, so a
    /// caller that retries at once cannot spin.
    pub(crate) async fn ended(&self, dead: &Arc<Session>) {
        {
            let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, dead)) {
                *current = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    /// The live session, opening a new one if the last expired or closed.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the provider is closed; connection errors.
    pub(crate) async fn get(&self) -> Result<Arc<Session>> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if let Some(s) = self.live() {
            return Ok(s);
        }
        tracing::info!("distlock zookeeper session ended; opening a new one");
        let session = Arc::new(open(&self.options).await?);
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            // Closed while this session was being opened: it is dropped (and
            // so closed) here, never stored.
            return Err(Error::Closed);
        }
        *current = Some(Arc::clone(&session));
        Ok(session)
    }
}

/// The `host:port` of each server in a connect string (`h1:2181,h2:2181/chroot`).
fn servers(hosts: &str) -> Vec<&str> {
    let list = hosts.split_once('/').map_or(hosts, |(list, _)| list);
    list.split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect()
}

/// Resolves once every server of `hosts` has refused a TCP connection
/// (nothing listens there); pends otherwise (one accepts, answers slowly, or
/// cannot be reached: the session's own connect decides), and for a list it
/// cannot read.
async fn every_server_refuses(hosts: &str) {
    let servers = servers(hosts);
    if servers.is_empty() {
        std::future::pending::<()>().await;
    }
    let tries = servers.iter().map(|server| async move {
        matches!(
            tokio::net::TcpStream::connect(*server).await,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    });
    if futures::future::join_all(tries)
        .await
        .into_iter()
        .all(|refused| refused)
    {
        return;
    }
    std::future::pending::<()>().await;
}

/// Opens a session and starts the task that publishes its state.
pub(crate) async fn open(options: &ZkOptions) -> Result<Session> {
    let mut connector = Client::connector()
        .with_session_timeout(options.session_timeout)
        .with_connection_timeout(options.connect_timeout);
    if let Some(digest) = &options.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    let connecting = async move {
        #[cfg(feature = "tls")]
        if let Some(tls) = &options.tls {
            crate::options::install_crypto_provider();
            return connector
                .with_tls(tls.clone())
                .secure_connect(&options.hosts)
                .await;
        }
        connector.connect(&options.hosts).await
    };
    // The client retries a refused server until its connect timeout; a
    // server list that every member refuses is answered at once instead.
    let connecting = async {
        tokio::select! {
            connected = connecting => Some(connected),
            () = every_server_refuses(&options.hosts) => None,
        }
    };
    let client = tokio::time::timeout(options.connect_timeout, connecting)
        .await
        .map_err(|_| Error::Timeout {
            operation: "zookeeper connect",
            after: options.connect_timeout,
        })?
        .ok_or_else(|| Error::Connection {
            backend: "zookeeper",
            source: format!(
                "connection refused by every server of {}",
                servers(&options.hosts).join(",")
            )
            .into(),
        })?
        .map_err(|e| from_zk("connect", options.connect_timeout, e))?;
    let mut states = client.state_watcher();
    let (tx, rx) = watch::channel(Status::from_state(states.state()));
    let id = client.session_id().0;
    tokio::spawn(async move {
        loop {
            let status = Status::from_state(states.changed().await);
            tracing::debug!(session = id, ?status, "distlock zookeeper session state");
            if tx.send(status).is_err() || status.is_dead() {
                return;
            }
        }
    });
    Ok(Session {
        client,
        status: rx,
        id,
    })
}
