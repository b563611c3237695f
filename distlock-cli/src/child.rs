//! The child: its own process group, signals forwarded to the group, stopped
//! (SIGTERM, then SIGKILL after the grace) when the lease is lost.
//!
//! The group is dead before the lock can be anyone else's: the SIGKILL
//! comes at the earlier of the grace's end and the instant until which the
//! lease is known held (`LockGuard::held_until`, the deadline at which
//! `lost()` fires, inside the TTL or the session timeout by the lease's
//! margin), here and in the guardian ([`crate::guardian`]), which distlock
//! keeps told of that instant. A lease lost at its deadline leaves no time:
//! SIGKILL at once. Each SIGKILL also reaches the groups the group's
//! descendants run in, a nested `distlock exec`'s child among them (see
//! [`crate::guardian::kill_group_and_offspring`]).

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use distlock::{LeaseStatus, LeaseWatch, LostReason};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::failure::{say, Failure, CANNOT_EXECUTE, NOT_FOUND};
use crate::guardian::Guardian;

/// The signals distlock catches, from the start, so that none of them
/// kills it while it holds a lease: every catchable signal whose default
/// action ends a process (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
/// SIGALRM; SIGUSR1 used to kill distlock and leave the lock held), and
/// SIGWINCH and SIGCONT, which a child may care about. SIGCHLD is
/// distlock's own; SIGKILL and SIGSTOP cannot be caught; the synchronous
/// ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS) are
/// about distlock itself. SIGTSTP (Ctrl-Z, `kill -TSTP`) is caught too and
/// handled as dumb-init does: forwarded to the child's group, then distlock
/// stops itself (SIGSTOP), so that a shell sees its job stopped; SIGCONT
/// continues both (see [`Running::supervise`]). SIGTTIN and SIGTTOU keep
/// their default (they stop distlock).
const CAUGHT: [i32; 10] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGTSTP,
];

/// The caught signals ([`CAUGHT`]).
pub struct Signals {
    caught: Vec<(i32, Signal)>,
}

impl Signals {
    /// Installs the handlers.
    pub fn install() -> io::Result<Self> {
        let caught = CAUGHT
            .iter()
            .map(|&n| signal(SignalKind::from_raw(n)).map(|s| (n, s)))
            .collect::<io::Result<_>>()?;
        Ok(Signals { caught })
    }

    /// The next signal that would have ended distlock (every caught one
    /// but SIGWINCH and SIGCONT, which are let pass, and SIGTSTP, which
    /// stops distlock as it would without a handler): what ends a wait
    /// (exit 128 + N).
    pub async fn recv(&mut self) -> i32 {
        loop {
            let n = self.next().await;
            if n == libc::SIGTSTP {
                stop_self();
            } else if n != libc::SIGWINCH && n != libc::SIGCONT {
                return n;
            }
        }
    }

    /// The next caught signal, whichever: what is forwarded to a child.
    pub async fn next(&mut self) -> i32 {
        let arrivals = self.caught.iter_mut().map(|(n, s)| {
            let n = *n;
            Box::pin(async move {
                s.recv().await;
                n
            })
        });
        futures::future::select_all(arrivals).await.0
    }
}

/// Stops distlock as SIGTSTP's default action would (SIGSTOP cannot be
/// caught): it runs on at the next SIGCONT. While stopped it renews nothing:
/// a stop longer than the lease loses it (seen when continued).
fn stop_self() {
    tracing::info!("stopping (SIGTSTP); SIGCONT continues");
    // SAFETY: raise(3) with a signal number.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}

/// What the child is told about its lease.
pub struct ChildEnv<'a> {
    /// `DISTLOCK_NAME`.
    pub name: &'a str,
    /// `DISTLOCK_FENCING_TOKEN`.
    pub fencing_token: u64,
    /// `DISTLOCK_OWNER`.
    pub owner: &'a str,
    /// `DISTLOCK_TOKENS`: `name=token` pairs joined by `,` (a lock's, not
    /// a leadership's).
    pub tokens: Option<String>,
}

/// A running child, leader of its own process group.
pub struct Running {
    child: Child,
    pgid: i32,
    /// SIGCHLD, which also tells that the child stopped (Ctrl-Z at the
    /// terminal stops the child's group, which has the terminal, directly).
    sigchld: Signal,
    terminal: Option<Foreground>,
    /// Ends the group should distlock end first (see [`crate::guardian`]).
    guardian: Guardian,
    /// Whether the holder was asked to release while the child ran.
    asked: bool,
    /// The leases the child runs under (several for a set of names).
    leases: Vec<LeaseWatch>,
    /// Whether every lease may still move (none ended).
    leases_live: bool,
}

/// The terminal handed to the child's group while it runs, so that an
/// interactive child can read it (a background group would be stopped by
/// SIGTTIN); given back to distlock's group when dropped.
struct Foreground {
    ours: libc::pid_t,
}

impl Foreground {
    /// Whether distlock's group is in the foreground of the terminal on
    /// stdin, so the child should take it.
    fn ours() -> Option<libc::pid_t> {
        use std::io::IsTerminal as _;
        if !std::io::stdin().is_terminal() {
            return None;
        }
        // SAFETY: plain libc queries.
        unsafe {
            let ours = libc::getpgrp();
            (libc::tcgetpgrp(0) == ours).then_some(ours)
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        // SAFETY: SIGTTOU is ignored so that taking the terminal back from
        // the background does not stop distlock.
        unsafe {
            libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, self.ours);
        }
    }
}

/// Starts `argv` in a new process group with the lease in its environment.
/// Should distlock itself die, the group is ended (SIGTERM, SIGKILL after
/// `grace` or at the deadline of `leases`, whichever comes first) by the
/// guardian ([`crate::guardian`]), and the leader gets SIGTERM from the
/// kernel besides: it would be running without the lease soon after.
pub fn spawn(
    argv: &[OsString],
    env: &ChildEnv<'_>,
    grace: Duration,
    leases: Vec<LeaseWatch>,
) -> Result<Running, Failure> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Failure::usage("missing command after `--`"))?;
    let mut guardian = Guardian::start(grace);
    // Before the child exists: it never runs with a guardian that does
    // not know the lease's deadline.
    guardian.hold_until(held_until(&leases));
    // Before the child exists, so that no stop of it goes unheard.
    let sigchld = signal(SignalKind::child()).map_err(|e| Failure {
        code: CANNOT_EXECUTE,
        message: format!("cannot watch the child: {e}"),
    })?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("DISTLOCK_NAME", env.name)
        .env("DISTLOCK_FENCING_TOKEN", env.fencing_token.to_string())
        .env("DISTLOCK_OWNER", env.owner)
        .process_group(0);
    if let Some(tokens) = &env.tokens {
        cmd.env("DISTLOCK_TOKENS", tokens);
    }
    // SAFETY: only async-signal-safe calls (prctl, getppid, signal,
    // tcsetpgrp) between fork and exec.
    let parent = std::process::id();
    let terminal = Foreground::ours();
    let take_terminal = terminal.is_some();
    unsafe {
        cmd.pre_exec(move || {
            if take_terminal {
                // In the child, before exec: the child never reads the
                // terminal from the background. SIGTTOU is ignored for the
                // call (we are not in the foreground yet), then restored.
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    // Built now so that a failed exec gives the terminal back too.
    let terminal = terminal.map(|ours| Foreground { ours });
    let child = cmd.spawn().map_err(|e| Failure {
        code: if e.kind() == io::ErrorKind::NotFound {
            NOT_FOUND
        } else {
            CANNOT_EXECUTE
        },
        message: format!("cannot run {}: {e}", program.to_string_lossy()),
    })?;
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    let Some(pgid) = pid else {
        return Err(Failure {
            code: CANNOT_EXECUTE,
            message: "the child exited before it could be watched".into(),
        });
    };
    guardian.guard(pgid);
    tracing::info!(pid = pgid, "child started");
    Ok(Running {
        child,
        pgid,
        sigchld,
        terminal,
        guardian,
        asked: false,
        leases,
        leases_live: true,
    })
}

/// The earliest of the leases' deadlines (see `LockGuard::held_until`).
fn held_until(leases: &[LeaseWatch]) -> Option<std::time::Instant> {
    leases.iter().filter_map(LeaseWatch::held_until).min()
}

/// Resolves when any of `leases` changed (a renewal moved its deadline, or
/// its status changed): `false` when one can change no more.
async fn moved(leases: &mut [LeaseWatch]) -> bool {
    if leases.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(leases.iter_mut().map(|w| Box::pin(w.changed())))
        .await
        .0
}

/// How a supervised child ended.
pub enum Ended {
    /// It exited (on its own or after a forwarded signal).
    Exited(ExitStatus),
    /// The lease was lost; the child was stopped.
    LeaseLost(LostReason),
}

impl Running {
    /// Whether someone asked the holder to release while the child ran
    /// (see [`Running::supervise`]).
    pub fn was_asked(&self) -> bool {
        self.asked
    }

    /// Waits for the child, forwarding signals to its group, and stops it if
    /// `lost` resolves first. When `asked` resolves (someone asked the
    /// holder to release), `on_request` goes to the group once, and the
    /// child is waited for as before.
    pub async fn supervise(
        &mut self,
        lost: impl Future<Output = LostReason>,
        asked: impl Future<Output = ()>,
        on_request: Option<i32>,
        signals: &mut Signals,
        grace: Duration,
    ) -> io::Result<Ended> {
        tokio::pin!(lost);
        tokio::pin!(asked);
        loop {
            tokio::select! {
                () = &mut asked, if !self.asked => {
                    self.asked = true;
                    match on_request {
                        Some(sig) => {
                            say!("asked to release: sending signal {sig} to the child");
                            self.signal_group(sig);
                            if sig == libc::SIGCONT {
                                self.give_terminal();
                            }
                        }
                        None => say!("asked to release (--on-request none: the child is not told)"),
                    }
                }
                status = self.child.wait() => {
                    self.terminal = None;
                    let status = status?;
                    // What the child started in its group and left running
                    // would run on without the lease once distlock
                    // releases it: ended first, as on a lost lease.
                    if self.group_alive() {
                        tracing::warn!(pgid = self.pgid, "the child exited, its group lives on: ending it");
                        self.stop(grace).await;
                    }
                    if !self.group_alive() {
                        self.guardian.dismiss();
                    }
                    // Killed at the lease's deadline by the guardian, a
                    // moment before distlock itself saw the lease lost
                    // (or a renewal moved the deadline too late for the
                    // guardian to hear of it).
                    if status.signal() == Some(libc::SIGKILL) {
                        if let Some(reason) = self.lost_reason() {
                            return Ok(Ended::LeaseLost(reason));
                        }
                        if self.guardian.deadline_passed() {
                            return Ok(Ended::LeaseLost(LostReason::Expired));
                        }
                    }
                    return Ok(Ended::Exited(status));
                }
                sig = signals.next() => {
                    tracing::info!(signal = sig, "forwarding signal to the child's group");
                    if sig == libc::SIGCONT {
                        // Continued in the foreground (`fg`): the terminal
                        // goes back to the child's group before it runs.
                        self.give_terminal();
                    }
                    self.signal_group(sig);
                    if sig == libc::SIGTSTP {
                        // As dumb-init: the group stops, then distlock,
                        // so that a shell sees its job stopped.
                        self.stop_after_the_group();
                    }
                }
                live = moved(&mut self.leases), if self.leases_live => {
                    // A renewal moved the deadline: the guardian is told,
                    // so that a SIGKILL of distlock leaves the group no
                    // longer than the lease.
                    self.leases_live = live;
                    self.guardian.hold_until(held_until(&self.leases));
                }
                _ = self.sigchld.recv() => {
                    if self.leader_stopped() {
                        // Ctrl-Z at the terminal stopped the child's group
                        // (it has the terminal); distlock stops after it
                        // instead of waiting blindly, and the shell gets
                        // the terminal back.
                        tracing::info!(pgid = self.pgid, "the child's group stopped");
                        self.stop_after_the_group();
                    }
                }
                reason = &mut lost => {
                    tracing::warn!(%reason, "lease lost: stopping the child");
                    self.stop(grace).await;
                    if !self.group_alive() {
                        self.guardian.dismiss();
                    }
                    self.terminal = None;
                    return Ok(Ended::LeaseLost(reason));
                }
            }
        }
    }

    /// SIGTERM to the group; SIGKILL to what is left of it (and to its
    /// descendants' groups) after `grace`,
    /// or at the lease's deadline if that comes first (at once if it
    /// passed: the lease ran out, someone else may hold it any moment).
    async fn stop(&mut self, grace: Duration) {
        let until = held_until(&self.leases);
        self.guardian.hold_until(until);
        let now = tokio::time::Instant::now();
        let by_grace = now.checked_add(grace);
        let until = until.map(tokio::time::Instant::from_std);
        let deadline = match (by_grace, until) {
            (Some(grace), Some(lease)) => grace.min(lease),
            (Some(at), None) | (None, Some(at)) => at,
            // A grace past the clock's end and no lease deadline: a year,
            // as good as no SIGKILL.
            (None, None) => now
                .checked_add(Duration::from_secs(365 * 24 * 3600))
                .unwrap_or(now),
        };
        if deadline <= now {
            tracing::warn!(
                pgid = self.pgid,
                "the lease's deadline has passed: SIGKILL to the child's group, no grace left"
            );
            crate::guardian::kill_group_and_offspring(self.pgid);
            let _ = self.child.wait().await;
            return;
        }
        if until.is_some_and(|lease| by_grace.is_none_or(|grace| lease < grace)) {
            tracing::warn!(
                pgid = self.pgid,
                left_ms = deadline.duration_since(now).as_millis(),
                "the lease ends before the grace: SIGKILL at the lease's deadline"
            );
        }
        self.signal_group(libc::SIGTERM);
        if tokio::time::timeout_at(deadline, self.child.wait())
            .await
            .is_ok()
        {
            // The leader is gone; its children may not be. A process
            // table check, not a lock poll: there is nothing to wake us.
            while self.group_alive() && tokio::time::Instant::now() < deadline {
                let next = tokio::time::Instant::now() + Duration::from_millis(20);
                tokio::time::sleep_until(next.min(deadline)).await;
            }
        }
        if self.group_alive() {
            tracing::warn!(
                pgid = self.pgid,
                "grace over (or the lease's deadline): SIGKILL to the child's group"
            );
            crate::guardian::kill_group_and_offspring(self.pgid);
        }
        let _ = self.child.wait().await;
    }

    /// Why a lease the child runs under was lost, if one was.
    fn lost_reason(&self) -> Option<LostReason> {
        self.leases.iter().find_map(|w| match w.status() {
            LeaseStatus::Lost(reason) => Some(reason),
            _ => None,
        })
    }

    fn signal_group(&self, sig: i32) {
        // SAFETY: kill(2) with a negative pid signals the process group.
        unsafe {
            libc::kill(-self.pgid, sig);
        }
    }

    /// Stops distlock after its child's group stopped; once continued
    /// (SIGCONT to distlock, as `fg` or `kill -CONT` send it), continues the
    /// group at once, before anything else is looked at (a stop report
    /// still pending would otherwise stop distlock again), with the
    /// terminal if distlock has it. The SIGCONT distlock caught is then
    /// forwarded as well: the group may see a second one.
    fn stop_after_the_group(&self) {
        stop_self();
        self.give_terminal();
        self.signal_group(libc::SIGCONT);
    }

    /// Whether the child (the group's leader) stopped since last asked:
    /// `waitid(WSTOPPED | WNOHANG)` takes the stop's report only, never an
    /// exit's (tokio reaps those).
    fn leader_stopped(&self) -> bool {
        let Some(pid) = self.child.id() else {
            return false;
        };
        // SAFETY: waitid(2) on our own child with a zeroed siginfo_t.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let done = libc::waitid(libc::P_PID, pid, &mut info, libc::WSTOPPED | libc::WNOHANG);
            done == 0 && info.si_pid() != 0 && info.si_code == libc::CLD_STOPPED
        }
    }

    /// Hands the terminal to the child's group again when distlock's group
    /// has it (continued by `fg`), not when it runs in the background.
    fn give_terminal(&self) {
        if let Some(terminal) = &self.terminal {
            // SAFETY: plain libc terminal calls; SIGTTOU is ignored for the
            // call as in `Foreground::drop`.
            unsafe {
                if libc::tcgetpgrp(0) == terminal.ours {
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(0, self.pgid);
                }
            }
        }
    }

    fn group_alive(&self) -> bool {
        // SAFETY: signal 0 only checks that the group exists.
        unsafe { libc::kill(-self.pgid, 0) == 0 }
    }
}

/// The shell's convention for a status: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        // Exit statuses are 0..=255 on Unix.
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|sig| u8::try_from(128 + (sig & 0x7f)).ok())
        .unwrap_or(1)
}

/// How a child ended, for messages: `status 0`, `signal 15`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => "an unknown status".to_owned(),
    }
}

/// Runs `--on-lost CMD` through `sh -c`, waiting for it; failures are reported, not fatal.
pub async fn run_on_lost(cmd: &str, env: &ChildEnv<'_>) {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(cmd)
        .env("DISTLOCK_NAME", env.name)
        .env("DISTLOCK_FENCING_TOKEN", env.fencing_token.to_string())
        .env("DISTLOCK_OWNER", env.owner);
    if let Some(tokens) = &env.tokens {
        sh.env("DISTLOCK_TOKENS", tokens);
    }
    let status = sh.status().await;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => say!("--on-lost command failed: {s}"),
        Err(e) => say!("cannot run --on-lost command: {e}"),
    }
}
