//! The subcommands.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::Duration;

use distlock::{
    Election, Holder, LeaderInfo, LeaseOptions, Lock, LockSet, Name, PrimitiveKind, Provider,
    Scheme, Wait,
};
use futures::StreamExt as _;

use crate::child::{self, ChildEnv, Ended, Signals};
use crate::cli::{
    Cli, Command, ElectArgs, ExecArgs, IdArgs, InspectArgs, LockArgs, LockChoice, UnlockArgs,
};
use crate::failure::{chain, print_out, say, Failure, LEASE_LOST, SOFTWARE, UNAVAILABLE};
use crate::{report, spinner};

/// How long closing the provider may take on the way out.
const CLOSE_LIMIT: Duration = Duration::from_secs(3);
/// The pause before campaigning again after a retryable error.
const RECAMPAIGN_BACKOFF: Duration = Duration::from_secs(1);

/// Runs the command line; `Ok` is the exit code.
pub async fn run(cli: Cli) -> Result<u8, Failure> {
    let url = cli
        .url
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Failure::usage("no backend: pass --url URL or set DISTLOCK_URL"));
    match cli.command {
        Command::Exec(args) => exec(&url?, &args).await,
        Command::Elect(args) => elect(&url?, &args).await,
        Command::Lock(args) => hold(&url?, &args).await,
        Command::Id(args) => id(&url?, &args).await,
        Command::Inspect(args) => inspect(&url?, &args).await,
        Command::Unlock(args) => unlock(&url?, &args).await,
    }
}

/// Checks what can be checked before connecting: the name, the URL's
/// scheme, and options the scheme cannot take. `mem://` is refused by
/// every command: its locks, ids and holders live in this one process and
/// end with it, so a lock taken, an id drawn or a holder inspected there is
/// nobody else's (`id` run twice printed 1 and 1).
fn check(url: &str, name: &str, ttl: Option<Duration>) -> Result<(), Failure> {
    Name::new(name).map_err(|e| Failure::from_error("", &e))?;
    let scheme = Scheme::of(url).map_err(|e| Failure::from_error("", &e))?;
    if scheme == Scheme::Mem {
        return Err(Failure::usage(
            "mem:// lives and ends in one process, so the command cannot share it with anyone: use a redis:// or zk:// URL",
        ));
    }
    if let Some(ttl) = ttl {
        check_ttl(ttl)?;
    }
    if scheme == Scheme::ZooKeeper && ttl.is_some() {
        return Err(Failure::usage(
            "--ttl does not apply to zk://: the ZooKeeper session is the lease (set ?session_timeout_ms= in the URL)",
        ));
    }
    Ok(())
}

/// Connects, giving up at the first signal (exit 128 + N).
async fn connect(url: &str, signals: Option<&mut Signals>) -> Result<Arc<dyn Provider>, Failure> {
    let connecting = distlock::connect(url);
    let result = match signals {
        Some(signals) => tokio::select! {
            r = connecting => r,
            sig = signals.recv() => return Err(Failure::signalled(sig)),
        },
        None => connecting.await,
    };
    result.map_err(|e| {
        let mut f = if let distlock::Error::Timeout { after, .. } = &e {
            // The library's "connect timed out after 5s" names neither the
            // backend nor where it looked.
            let (backend, servers) = servers_of(url);
            Failure {
                code: UNAVAILABLE,
                message: format!(
                    "connecting to {backend} at {servers}: no answer within {after:?} (the connect timeout: ?connect_timeout_ms= in the URL sets it)"
                ),
            }
        } else {
            Failure::from_error("", &e)
        };
        if !e.is_invalid_input() {
            f.code = UNAVAILABLE;
        }
        f
    })
}

/// The backend of `url` and its servers (`host:port[,host:port…]`), with
/// no credentials, for messages.
fn servers_of(url: &str) -> (&'static str, &str) {
    let backend = match Scheme::of(url) {
        Ok(Scheme::ZooKeeper) => "zookeeper",
        Ok(Scheme::Mem) => "mem",
        _ => "redis",
    };
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let authority = rest.split('/').next().unwrap_or("");
    let servers = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    (backend, servers)
}

async fn close(provider: &dyn Provider) {
    match tokio::time::timeout(CLOSE_LIMIT, provider.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %chain(&e), "closing the provider"),
        Err(_) => tracing::warn!("closing the provider took too long; leaving it"),
    }
}

fn lease(provider: &dyn Provider, ttl: Option<Duration>) -> Result<LeaseOptions, Failure> {
    match ttl {
        Some(ttl) => check_ttl(ttl),
        None => Ok(provider.default_lease()),
    }
}

/// `--ttl` as lease options, refused in the flag's own terms (the
/// library's "lease TTL 0ns is outside 10ms..=2592000s" spoke in neither).
fn check_ttl(ttl: Duration) -> Result<LeaseOptions, Failure> {
    LeaseOptions::new(ttl).map_err(|_| {
        Failure::usage(format!(
            "--ttl must be between 0.01 (10 ms) and 2592000 (30 days) seconds, got {}",
            ttl.as_secs_f64()
        ))
    })
}

fn install_signals() -> Result<Signals, Failure> {
    Signals::install().map_err(|e| Failure {
        code: SOFTWARE,
        message: format!("cannot install signal handlers: {e}"),
    })
}

async fn exec(url: &str, args: &ExecArgs) -> Result<u8, Failure> {
    check(url, &args.lock.name, args.run.ttl)?;
    for name in &args.more {
        Name::new(name).map_err(|e| Failure::from_error("", &e))?;
    }
    if !args.more.is_empty() && (args.lock.semaphore.is_some() || args.lock.read || args.lock.write)
    {
        return Err(Failure::usage(
            "several names take mutexes (or fair mutexes with --fair), not --semaphore, --read or --write",
        ));
    }
    let mut signals = install_signals()?;
    let provider = connect(url, Some(&mut signals)).await?;
    let result = if args.more.is_empty() {
        exec_on(&*provider, args, &mut signals).await
    } else {
        exec_set(&*provider, args, &mut signals).await
    };
    close(&*provider).await;
    result
}

async fn exec_on(
    provider: &dyn Provider,
    args: &ExecArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let name = args.lock.name.as_str();
    let choice = Choice::of(&args.lock, args.run.ttl);
    let guard = match acquire(provider, &choice, signals).await? {
        Some((guard, _)) => guard,
        None => return Ok(args.lock.conflict_exit_code),
    };
    let env = ChildEnv {
        name,
        fencing_token: guard.fencing_token(),
        owner: provider.owner(),
        tokens: Some(format!("{name}={}", guard.fencing_token())),
    };
    let mut running = match child::spawn(&args.command, &env, args.run.grace, vec![guard.watch()]) {
        Ok(running) => running,
        Err(f) => {
            let _ = guard.release().await;
            return Err(f);
        }
    };
    match running
        .supervise(
            guard.lost(),
            guard.release_requested(),
            args.run.on_request.0,
            signals,
            args.run.grace,
        )
        .await
    {
        Ok(Ended::Exited(status)) => {
            let released = guard.release().await;
            if let Err(e) = &released {
                say!("releasing {name}: {}", chain(e));
            }
            if running.was_asked() && released.is_ok() {
                say!(
                    "released {name} as asked (the child exited with {})",
                    child::describe(status)
                );
            }
            Ok(child::exit_code(status))
        }
        Ok(Ended::LeaseLost(reason)) => {
            say!("lease on {name} lost ({reason}): the child was stopped");
            drop(guard);
            if let Some(cmd) = &args.run.on_lost {
                child::run_on_lost(cmd, &env).await;
            }
            Ok(LEASE_LOST)
        }
        Err(e) => {
            let _ = guard.release().await;
            Err(Failure {
                code: SOFTWARE,
                message: format!("waiting for the child: {e}"),
            })
        }
    }
}

/// `exec` of several names: a lock set, all or nothing.
async fn exec_set(
    provider: &dyn Provider,
    args: &ExecArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let first = args.lock.name.as_str();
    let choice = Choice::of(&args.lock, args.run.ttl);
    let mut locks = Vec::with_capacity(args.more.len() + 1);
    for name in std::iter::once(first).chain(args.more.iter().map(String::as_str)) {
        locks.push(open(provider, &Choice { name, ..choice })?.0);
    }
    let set = LockSet::from_locks(locks).map_err(|e| Failure::from_error("", &e))?;
    let wait = if choice.no_wait {
        Wait::No
    } else {
        choice.wait.map_or(Wait::Forever, Wait::timeout)
    };
    let names = set.names().map(Name::as_str).collect::<Vec<_>>().join(", ");
    let acquired = {
        let acquire = set.acquire(wait);
        tokio::pin!(acquire);
        tokio::select! {
            r = &mut acquire => r,
            // Dropping the acquisition releases what it took (cancellation safe).
            sig = signals.recv() => return Err(Failure::signalled(sig)),
        }
    };
    let guard = match acquired {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            tracing::info!("not acquired: the set {names}");
            return Ok(args.lock.conflict_exit_code);
        }
        Err(e) => return Err(Failure::from_error(&format!("acquiring {names}"), &e)),
    };
    let tokens = guard
        .tokens()
        .map(|(name, token)| format!("{name}={token}"))
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!("acquired the set {tokens}");
    let env = ChildEnv {
        name: first,
        fencing_token: guard.fencing_token(first).unwrap_or_default(),
        owner: provider.owner(),
        tokens: Some(tokens),
    };
    let mut running = match child::spawn(
        &args.command,
        &env,
        args.run.grace,
        guard
            .guards()
            .iter()
            .map(distlock::LockGuard::watch)
            .collect(),
    ) {
        Ok(running) => running,
        Err(f) => {
            let _ = guard.release().await;
            return Err(f);
        }
    };
    let lost = guard.lost();
    // Which name was lost, for the message after the child stopped.
    let lost_name = Arc::new(std::sync::Mutex::new(None));
    let seen = Arc::clone(&lost_name);
    let lost = async move {
        let (name, reason) = lost.await;
        if let Ok(mut slot) = seen.lock() {
            *slot = Some(name);
        }
        reason
    };
    let asked = guard.release_requested();
    let asked = async move {
        let name = asked.await;
        tracing::info!(%name, "asked to release a name of the set");
    };
    match running
        .supervise(lost, asked, args.run.on_request.0, signals, args.run.grace)
        .await
    {
        Ok(Ended::Exited(status)) => {
            let mut all = true;
            for (name, result) in guard.release_each().await {
                if let Err(e) = result {
                    all = false;
                    say!("releasing {name}: {}", chain(&e));
                }
            }
            if running.was_asked() && all {
                say!(
                    "released {names} as asked (the child exited with {})",
                    child::describe(status)
                );
            }
            Ok(child::exit_code(status))
        }
        Ok(Ended::LeaseLost(reason)) => {
            let which = lost_name
                .lock()
                .ok()
                .and_then(|n| n.as_ref().map(ToString::to_string))
                .unwrap_or_else(|| names.clone());
            say!("lease on {which} lost ({reason}): the child was stopped");
            drop(guard);
            if let Some(cmd) = &args.run.on_lost {
                child::run_on_lost(cmd, &env).await;
            }
            Ok(LEASE_LOST)
        }
        Err(e) => {
            let _ = guard.release().await;
            Err(Failure {
                code: SOFTWARE,
                message: format!("waiting for the child: {e}"),
            })
        }
    }
}

/// What `exec` and `lock` acquire.
#[derive(Clone, Copy)]
struct Choice<'a> {
    name: &'a str,
    semaphore: Option<u32>,
    read: bool,
    write: bool,
    fair: bool,
    no_wait: bool,
    wait: Option<Duration>,
    ttl: Option<Duration>,
}

impl<'a> Choice<'a> {
    /// The lock `lock` names, with lease `ttl`.
    fn of(lock: &'a LockChoice, ttl: Option<Duration>) -> Self {
        Choice {
            name: &lock.name,
            semaphore: lock.semaphore,
            read: lock.read,
            write: lock.write,
            fair: lock.fair,
            no_wait: lock.no_wait,
            wait: lock.wait,
            ttl,
        }
    }
}

/// The lock `choice` names, and its kind.
fn open(
    provider: &dyn Provider,
    choice: &Choice<'_>,
) -> Result<(Arc<dyn Lock>, PrimitiveKind), Failure> {
    let name = choice.name;
    let lease = lease(provider, choice.ttl)?;
    let bad = |e: distlock::Error| Failure::from_error("", &e);
    let view = provider.with_lease(lease).map_err(bad)?;
    Ok(if let Some(permits) = choice.semaphore {
        let semaphore = view.semaphore(name, permits).map_err(bad)?;
        (semaphore, PrimitiveKind::Semaphore)
    } else if choice.read || choice.write {
        let rw = view.rw_lock(name).map_err(bad)?;
        let side = if choice.read { rw.read() } else { rw.write() };
        (side, PrimitiveKind::ReadWrite)
    } else if choice.fair {
        let fair = view.fair_mutex(name).map_err(bad)?;
        (fair, PrimitiveKind::FairMutex)
    } else {
        (view.mutex(name).map_err(bad)?, PrimitiveKind::Mutex)
    })
}

/// Acquires what `choice` names, showing the wait; `None` when not
/// acquired (-n, -w), a signal while waiting is `Failure::signalled`.
async fn acquire(
    provider: &dyn Provider,
    choice: &Choice<'_>,
    signals: &mut Signals,
) -> Result<Option<(distlock::LockGuard, PrimitiveKind)>, Failure> {
    let name = choice.name;
    let (lock, kind) = open(provider, choice)?;
    let wait = if choice.no_wait {
        Wait::No
    } else {
        choice.wait.map_or(Wait::Forever, Wait::timeout)
    };
    let acquired = {
        let acquire = lock.acquire(wait);
        let shown = spinner::waiting(provider, name, kind, wait);
        tokio::pin!(acquire, shown);
        tokio::select! {
            r = &mut acquire => r,
            // Dropping the acquisition withdraws it (cancellation safe).
            sig = signals.recv() => return Err(Failure::signalled(sig)),
            () = &mut shown => unreachable!("the spinner never ends"),
        }
    };
    let what = if choice.semaphore.is_some() {
        "a permit of semaphore"
    } else if choice.read {
        "the read side of"
    } else if choice.write {
        "the write side of"
    } else if choice.fair {
        "fair mutex"
    } else {
        "mutex"
    };
    match acquired {
        Ok(Some(guard)) => {
            tracing::info!("acquired {what} {name}, token {}", guard.fencing_token());
            Ok(Some((guard, kind)))
        }
        Ok(None) => {
            tracing::info!("not acquired: {what} {name}");
            Ok(None)
        }
        Err(e) => {
            let e = key_of_another_type(provider, name, kind, e).await;
            Err(Failure::from_error(&format!("acquiring {name}"), &e))
        }
    }
}

/// A Redis key of another type under the name, as the acquisition reports
/// it ("redis key \"x\" is not a distlock lock (a string key)", which read
/// as if the key were a string), said with the type found: inspect reads
/// it (`redis key "x" (a list) is not …`).
async fn key_of_another_type(
    provider: &dyn Provider,
    name: &str,
    kind: PrimitiveKind,
    e: distlock::Error,
) -> distlock::Error {
    let on_a_key = |e: &distlock::Error| matches!(e, distlock::Error::Conflict { what, .. } if what.starts_with("redis key \""));
    if !on_a_key(&e) {
        return e;
    }
    match tokio::time::timeout(CLOSE_LIMIT, provider.inspect(name, kind)).await {
        Ok(Err(typed)) if on_a_key(&typed) => typed,
        _ => e,
    }
}

/// `distlock lock`: acquire, print the token (or the hold as JSON), hold
/// until stdin ends or a signal, release.
async fn hold(url: &str, args: &LockArgs) -> Result<u8, Failure> {
    check(url, &args.lock.name, args.ttl)?;
    let mut signals = install_signals()?;
    let provider = connect(url, Some(&mut signals)).await?;
    let result = hold_on(&*provider, args, &mut signals).await;
    close(&*provider).await;
    result
}

async fn hold_on(
    provider: &dyn Provider,
    args: &LockArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let name = args.lock.name.as_str();
    let choice = Choice::of(&args.lock, args.ttl);
    let (guard, kind) = match acquire(provider, &choice, signals).await? {
        Some(held) => held,
        None => return Ok(args.lock.conflict_exit_code),
    };
    let line = if args.json {
        serde_json::json!({
            "name": name,
            "kind": kind.as_str(),
            "fencing_token": guard.fencing_token(),
            "owner": provider.owner(),
            "backend": provider.backend(),
        })
        .to_string()
    } else {
        guard.fencing_token().to_string()
    };
    // A reader gone before it read the token: release and stop.
    if !print_out(&format!("{line}\n"))? {
        let _ = guard.release().await;
        return Ok(0);
    }
    // stdin is read on a thread of its own: a read blocked there never
    // holds up the exit (tokio's blocking pool would, at shutdown).
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
        let _ = eof_tx.send(());
    });
    let asked = guard.release_requested();
    tokio::pin!(asked);
    tokio::pin!(eof_rx);
    let mut told = false;
    let code = loop {
        tokio::select! {
            _ = &mut eof_rx => break 0,
            sig = signals.recv() => break Failure::signalled(sig).code,
            reason = guard.lost() => {
                say!("lease on {name} lost ({reason}): the lock is no longer held");
                return Ok(LEASE_LOST);
            }
            () = &mut asked, if !told => {
                // Someone asks the holder to let go: the script reading
                // our stdout decides when (closing our stdin releases).
                told = true;
                let line = if args.json {
                    serde_json::json!({ "name": name, "release_requested": true }).to_string()
                } else {
                    "release-requested".to_owned()
                };
                if !print_out(&format!("{line}\n"))? {
                    break 0;
                }
            }
        }
    };
    if let Err(e) = guard.release().await {
        say!("releasing {name}: {}", chain(&e));
    }
    Ok(code)
}

async fn elect(url: &str, args: &ElectArgs) -> Result<u8, Failure> {
    check(url, &args.name, args.run.ttl)?;
    let mut signals = install_signals()?;
    let provider = connect(url, Some(&mut signals)).await?;
    let result = if args.observe {
        observe(&*provider, &args.name, args.json, &mut signals).await
    } else {
        lead(&*provider, args, &mut signals).await
    };
    close(&*provider).await;
    result
}

async fn observe(
    provider: &dyn Provider,
    name: &str,
    json: bool,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let election = provider
        .election(name)
        .map_err(|e| Failure::from_error("", &e))?;
    let mut leaders = election.observe();
    let mut last: Option<Option<LeaderInfo>> = None;
    loop {
        tokio::select! {
            next = leaders.next() => match next {
                Some(Ok(leader)) => {
                    if last.as_ref() != Some(&leader) {
                        let line = match &leader {
                            _ if json => format!(
                                "{}\n",
                                serde_json::json!({
                                    "name": name,
                                    "leader": leader.as_ref().map(|l| serde_json::json!({ "id": l.id, "term": l.term })),
                                })
                            ),
                            Some(l) => format!("leader {} term {}\n", l.id, l.term),
                            None => "no leader\n".to_owned(),
                        };
                        if !print_out(&line)? {
                            return Ok(0);
                        }
                        last = Some(leader);
                    }
                }
                Some(Err(e)) => return Err(Failure::from_error(&format!("observing {name}"), &e)),
                None => return Err(Failure {
                    code: UNAVAILABLE,
                    message: format!("observing {name}: the leader stream ended"),
                }),
            },
            _ = signals.recv() => return Ok(0),
        }
    }
}

async fn lead(
    provider: &dyn Provider,
    args: &ElectArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let name = args.name.as_str();
    let lease = lease(provider, args.run.ttl)?;
    let election: Arc<dyn Election> = provider
        .with_lease(lease)
        .and_then(|view| view.election(name))
        .map_err(|e| Failure::from_error("", &e))?;
    let candidate = provider.owner();
    let mut round = 0u64;
    loop {
        round += 1;
        let campaign = tokio::select! {
            r = election.campaign(candidate) => r,
            sig = signals.recv() => return Err(Failure::signalled(sig)),
        };
        let leadership = match campaign {
            Ok(leadership) => leadership,
            Err(e) if round > 1 && e.is_retryable() => {
                tracing::warn!(error = %chain(&e), "campaigning again");
                tokio::select! {
                    () = tokio::time::sleep(RECAMPAIGN_BACKOFF) => continue,
                    sig = signals.recv() => return Err(Failure::signalled(sig)),
                }
            }
            Err(e) => return Err(Failure::from_error(&format!("campaigning in {name}"), &e)),
        };
        tracing::info!(name, term = leadership.term(), "elected");
        let env = ChildEnv {
            name,
            fencing_token: leadership.term(),
            owner: candidate,
            tokens: None,
        };
        let mut running = match child::spawn(
            &args.command,
            &env,
            args.run.grace,
            vec![leadership.watch()],
        ) {
            Ok(running) => running,
            Err(f) => {
                let _ = leadership.resign().await;
                return Err(f);
            }
        };
        match running
            .supervise(
                leadership.lost(),
                leadership.release_requested(),
                args.run.on_request.0,
                signals,
                args.run.grace,
            )
            .await
        {
            Ok(Ended::Exited(status)) => {
                let resigned = leadership.resign().await;
                if let Err(e) = &resigned {
                    say!("resigning {name}: {}", chain(e));
                }
                if running.was_asked() && resigned.is_ok() {
                    say!(
                        "resigned {name} as asked (the child exited with {})",
                        child::describe(status)
                    );
                }
                return Ok(child::exit_code(status));
            }
            Ok(Ended::LeaseLost(reason)) => {
                say!("leadership of {name} lost ({reason}): the child was stopped");
                drop(leadership);
                if let Some(cmd) = &args.run.on_lost {
                    child::run_on_lost(cmd, &env).await;
                }
                if args.once {
                    return Ok(LEASE_LOST);
                }
            }
            Err(e) => {
                let _ = leadership.resign().await;
                return Err(Failure {
                    code: SOFTWARE,
                    message: format!("waiting for the child: {e}"),
                });
            }
        }
    }
}

async fn id(url: &str, args: &IdArgs) -> Result<u8, Failure> {
    check(url, &args.name, None)?;
    let provider = connect(url, None).await?;
    let result = async {
        let ids = provider
            .id_generator(&args.name, args.block)
            .map_err(|e| Failure::from_error("", &e))?;
        // Printed a line at a time: a reader may be waiting for each id.
        for _ in 0..args.count {
            let id = ids
                .next()
                .await
                .map_err(|e| Failure::from_error(&format!("next id of {}", args.name), &e))?;
            let line = if args.json {
                serde_json::json!({ "name": args.name, "id": id }).to_string()
            } else {
                id.to_string()
            };
            if !print_out(&format!("{line}\n"))? {
                break;
            }
        }
        Ok(0)
    }
    .await;
    close(&*provider).await;
    result
}

async fn inspect(url: &str, args: &InspectArgs) -> Result<u8, Failure> {
    check(url, &args.name, None)?;
    let provider = connect(url, None).await?;
    let snapshot = provider.inspect(&args.name, args.kind).await;
    close(&*provider).await;
    let snapshot =
        snapshot.map_err(|e| Failure::from_error(&format!("inspecting {}", args.name), &e))?;
    if args.json {
        print_out(&format!("{}\n", report::json(&snapshot)))?;
    } else {
        print_out(&report::table(&snapshot))?;
    }
    Ok(0)
}

async fn unlock(url: &str, args: &UnlockArgs) -> Result<u8, Failure> {
    check(url, &args.name, None)?;
    let confirm = args.force && !args.yes;
    if confirm && !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(Failure::usage(
            "refusing to force-release without --yes: there is no terminal to ask on",
        ));
    }
    let provider = connect(url, None).await?;
    let result = unlock_on(&*provider, args, confirm).await;
    close(&*provider).await;
    result
}

/// How often `unlock` looks whether the holders it asked have let go.
const UNLOCK_POLL: Duration = Duration::from_millis(100);

/// Asks the holders to let go and waits up to `--grace` for them; then,
/// with `--force`, evicts what still holds (`--grace 0 --force`: at once,
/// unasked).
async fn unlock_on(
    provider: &dyn Provider,
    args: &UnlockArgs,
    confirm: bool,
) -> Result<u8, Failure> {
    let name = args.name.as_str();
    let kind = args.kind;
    if !(args.force && args.grace.is_zero()) {
        match provider.request_release(name, kind).await {
            Ok(asked) if asked.is_empty() => {
                print_out(&format!("{kind} {name} is not held\n"))?;
                return Ok(0);
            }
            Ok(asked) => {
                say!(
                    "asked {} holder(s) of {kind} {name} to release ({}); waiting up to {:?}",
                    asked.len(),
                    report::holders_of(&asked),
                    args.grace
                );
                let still = let_go_within(provider, name, kind, &asked, args.grace).await?;
                if still.is_empty() {
                    print_out(&format!(
                        "{kind} {name} released by its holder(s) as asked\n"
                    ))?;
                    return Ok(0);
                }
                if !args.force {
                    say!(
                        "{kind} {name} still {} after {:?}; --force evicts",
                        report::holders_of(&still),
                        args.grace
                    );
                    return Ok(1);
                }
                say!(
                    "{kind} {name} still {} after {:?}: forcing",
                    report::holders_of(&still),
                    args.grace
                );
            }
            Err(e @ distlock::Error::Unsupported { .. }) if args.force => {
                say!("{}: cannot ask the holders, forcing", chain(&e));
            }
            Err(e) => {
                return Err(Failure::from_error(
                    &format!("asking the holders of {name} to release"),
                    &e,
                ))
            }
        }
    }
    if confirm {
        let holders = match provider.inspect(name, kind).await {
            Ok(snapshot) => report::holders_brief(&snapshot),
            Err(e) => format!("holders unknown: {}", chain(&e)),
        };
        eprint!(
            "Force-release {kind} {name} ({holders})? Evicted holders may still be working. [y/N] "
        );
        let _ = std::io::stderr().flush();
        let answer = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        })
        .await;
        let yes = matches!(answer, Ok(Ok(line)) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"));
        if !yes {
            say!("not released");
            return Ok(1);
        }
    }
    let done = provider
        .force_release(name, kind)
        .await
        .map_err(|e| Failure::from_error(&format!("force-releasing {name}"), &e))?;
    let fence = done
        .fence
        .map(|f| format!(", fence {f}"))
        .unwrap_or_default();
    print_out(&format!(
        "force-released {kind} {name}: {} hold(s) evicted{fence}\n",
        done.evicted
    ))?;
    Ok(0)
}

/// Waits up to `grace` until none of `asked` holds `name` any more (nor
/// any holder marked asked); returns those that still hold then.
async fn let_go_within(
    provider: &dyn Provider,
    name: &str,
    kind: PrimitiveKind,
    asked: &[Holder],
    grace: Duration,
) -> Result<Vec<Holder>, Failure> {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let snapshot = provider
            .inspect(name, kind)
            .await
            .map_err(|e| Failure::from_error(&format!("inspecting {name}"), &e))?;
        let still: Vec<Holder> = snapshot
            .holders
            .into_iter()
            .filter(|h| {
                h.release_requested
                    || asked.iter().any(|a| {
                        a.role == h.role
                            && a.owner == h.owner
                            && a.foreign == h.foreign
                            && a.fencing_token == h.fencing_token
                    })
            })
            .collect();
        if still.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(still);
        }
        tokio::time::sleep(UNLOCK_POLL.min(deadline - tokio::time::Instant::now())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::servers_of;

    #[test]
    fn servers_are_named_without_credentials() {
        assert_eq!(
            servers_of("redis://u:s3cret@127.0.0.1:6379/2?x=1"),
            ("redis", "127.0.0.1:6379")
        );
        assert_eq!(
            servers_of("zk://a:1,b:2/chroot?connect_timeout_ms=5"),
            ("zookeeper", "a:1,b:2")
        );
        assert_eq!(
            servers_of("redis+cluster://h1:1,h2:2"),
            ("redis", "h1:1,h2:2")
        );
    }
}
