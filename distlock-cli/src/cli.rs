//! The command line, as clap reads it.

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};
use distlock::PrimitiveKind;

const EXAMPLES: &str = "\
Examples:
  # a nightly job on one machine of many at a time; skip it when another runs it
  distlock --url redis://redis.internal:6379 exec -n jobs/nightly -- ./nightly.sh

  # deploys one after another, waiting up to 10 minutes for the previous one
  DISTLOCK_URL=zk://zk1.internal:2181,zk2.internal:2181/ci distlock exec -w 600 deploy/prod -- make deploy

  # run a scheduler only on the leader, stepping down when leadership is lost
  distlock elect scheduler -- ./scheduler

Exit codes:
  the child's status    the child exited (128 + N when it died of signal N)
  1, or -E CODE         not acquired: -n while held, -w SECS timed out
  75  (EX_TEMPFAIL)     the lease was lost while the child ran (it was stopped)
  128 + N               signal N arrived while waiting (nothing ran, nothing is held)
  64  (EX_USAGE)        bad flag, URL or name; mem://; --ttl on zk://; unlock --force without --yes off a terminal
  65  (EX_DATAERR)      the name holds another primitive or another kind of data
  69  (EX_UNAVAILABLE)  backend unreachable or refusing (connection, authentication, ACL)
  70  (EX_SOFTWARE)     any other runtime error";

/// Runs programs under distributed locks or as leader, over Redis or ZooKeeper.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, after_help = EXAMPLES)]
pub struct Cli {
    /// The backend: `redis://host:6379`, `redis+cluster://h1:p1,h2:p2`,
    /// `zk://h1:2181,h2:2181/chroot`, ... (any URL `distlock::connect` takes).
    #[arg(long, env = "DISTLOCK_URL", global = true, value_name = "URL")]
    pub url: Option<String>,

    /// Tracing output on stderr (`-v` info, `-vv` debug, `-vvv` trace).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire a lock, run CMD, release the lock when CMD exits.
    #[command(after_help = "\
Examples:
  distlock exec -n jobs/nightly -- ./nightly.sh          # skip if held (exit 1)
  distlock exec -w 30 -E 3 db/migrate -- ./migrate.sh     # wait 30 s, exit 3 if still held
  distlock exec --semaphore 4 gpu -- ./train.sh           # at most 4 at once
  distlock exec --read catalog -- ./report.sh             # readers share, --write excludes
  distlock exec accounts/9 accounts/7 -- ./transfer.sh    # both mutexes, all or nothing

The child sees DISTLOCK_NAME, DISTLOCK_FENCING_TOKEN, DISTLOCK_TOKENS and DISTLOCK_OWNER.
With several NAMEs (mutexes, or fair mutexes with --fair) all are taken or none, in the
names' byte order whatever order they are given (so overlapping sets never deadlock); -n and
-w apply to the whole set. DISTLOCK_TOKENS is every name with its fencing token,
`name=token` joined by `,` in that order (one pair for one name); DISTLOCK_NAME and
DISTLOCK_FENCING_TOKEN are the first NAME given and its token. The lease of any one name
lost stops the child as below. It runs in its own
process group; every catchable signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
SIGALRM, SIGWINCH, SIGCONT) goes to the whole group. If the lease is
lost the group gets SIGTERM, then SIGKILL after --grace, and distlock exits 75.

The group is dead before the lock can be anyone else's: SIGKILL comes after --grace or at
the lease's deadline, whichever is first. The deadline is where distlock counts the lease
lost unless renewed: the last renewal (or acquisition) plus the TTL less its drift margin
(TTL/100 + 2 ms) on Redis; 3/4 of the session timeout less that margin after the last
session check on ZooKeeper; both before the server may hand the lock on. A lease lost by
running out to its deadline (server unreachable, distlock stopped) leaves no time: SIGKILL
at once, no SIGTERM; a child that must clean up needs a lease longer than its cleanup and
a server it can reach. The same holds should distlock itself die, even by kill -9: a
guardian process it keeps told of the deadline ends the group (SIGTERM, SIGKILL after
--grace or at the deadline, whichever is first). The guardian runs in a process group of
its own, so a signal to distlock's whole group (kill -9 -PGID, kill -STOP %job, timeout
-s KILL) does not reach it. Each SIGKILL also reaches the groups that the child's
descendants run in while their parent lives (a nested distlock exec's child).

Ctrl-Z (SIGTSTP) stops the child's group, then distlock itself (as dumb-init), so the shell
sees the job stopped; SIGCONT (fg, bg, kill -CONT) continues both. A stopped distlock
renews nothing: a stop longer than the lease (--ttl; ZooKeeper's session) loses the lock,
the guardian SIGKILLs the stopped group at the lease's deadline, and when continued
distlock exits 75.")]
    Exec(ExecArgs),

    /// Campaign for leadership and run CMD only while leader.
    #[command(after_help = "\
Examples:
  distlock elect scheduler -- ./scheduler        # re-campaigns after losing leadership
  distlock elect --once scheduler -- ./scheduler # exits 75 when leadership is lost
  distlock elect --observe scheduler             # one line per leader change, until SIGINT
  distlock elect --observe --json scheduler      # {\"name\",\"leader\":{\"id\",\"term\"} or null} a line

CMD runs with DISTLOCK_NAME, DISTLOCK_FENCING_TOKEN (the term) and DISTLOCK_OWNER. When it
exits, distlock resigns and exits with its status. When leadership is lost, CMD's group gets
SIGTERM, then SIGKILL after --grace or at the lease's deadline, whichever is first (at once
when the lease ran out; see distlock exec --help: the group is dead before anyone else can
lead, also should distlock die); then distlock campaigns again (or exits 75 with --once).")]
    Elect(ElectArgs),

    /// Acquire a lock and hold it, with no command, until stdin closes or a
    /// signal: for part of a shell script.
    #[command(after_help = "\
Examples:
  # hold jobs/x across part of a script: the lock is held while the coprocess's stdin is open
  coproc LOCK { distlock lock jobs/x; }
  read -r token <&\"${LOCK[0]}\"            # the fencing token: acquired
  ./step1.sh \"$token\"; ./step2.sh
  exec {LOCK[1]}>&-; wait \"$LOCK_PID\"        # close its stdin: released, exit 0

Prints the fencing token on a line of its own once acquired (with --json one object:
name, kind, fencing_token, owner, backend), then holds: renewing the lease, until stdin
reaches end of file (exit 0) or a signal arrives (released, exit 128 + N). Exit codes as
exec: 1 or -E when not acquired (-n, -w), 75 when the lease was lost while held (the
holder must stop: check the status), 64, 65, 69, 70 as in distlock --help.")]
    Lock(LockArgs),

    /// Print unique, increasing ids, one a line.
    #[command(after_help = "\
Examples:
  distlock id orders               # one id
  distlock id orders --count 1000 --block 100
  distlock id orders --json        # {\"name\":\"orders\",\"id\":N} a line")]
    Id(IdArgs),

    /// Show who holds and who waits for a name.
    #[command(after_help = "\
Examples:
  distlock inspect jobs/nightly
  distlock inspect scheduler --kind election --json")]
    Inspect(InspectArgs),

    /// Ask the holders of a name to let go; with --force, evict those that
    /// do not within the grace period (dangerous: for operators).
    #[command(after_help = "\
Examples:
  distlock unlock jobs/nightly                   # ask, wait up to 30 s for the holder to let go
  distlock unlock --grace 120 --force jobs/nightly   # ask, then evict after 2 minutes (confirms)
  distlock unlock --grace 0 --force --yes --kind rw catalog   # evict at once, unasked

The request is cooperative: a holder hears it (a distlock exec sends its child --on-request,
SIGTERM by default; a program's guard resolves release_requested(); a revocable Curator
lock's listener runs) and releases when its work allows. ZooKeeper holders hear it at once,
Redis holders at their next renewal (a third of the lease). Exit 0 once every holder asked
has let go (or nobody held the name), 1 when one still holds after --grace and --force was
not given. Evicted holders are not asked: a distlock exec holding the name stops its child
and exits 75 once its backend tells it (ZooKeeper at once, Redis at its next renewal).")]
    Unlock(UnlockArgs),
}

/// Options shared by `exec` and `elect`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Lease TTL in seconds (Redis; ZooKeeper's lease is its session).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub ttl: Option<Duration>,

    /// Seconds between SIGTERM and SIGKILL when the lease is lost (or
    /// distlock dies), cut short by the lease: SIGKILL comes at the lease's
    /// deadline at the latest, at once when the lease ran out to it.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, default_value = "10")]
    pub grace: Duration,

    /// A shell command (`sh -c`) to run after the child was stopped because
    /// the lease was lost.
    #[arg(long, value_name = "CMD")]
    pub on_lost: Option<String>,

    /// The signal sent (once) to the child's group when someone asks the
    /// holder to release (`distlock unlock`, `Provider::request_release`,
    /// Curator's `Revoker`): a name (`TERM`, `SIGUSR1`), a number, or
    /// `none`. The lock is released when the child exits.
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal, default_value = "TERM")]
    pub on_request: OnRequest,
}

/// What `--on-request` sends: a signal number, or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnRequest(pub Option<i32>);

/// A signal by name (with or without `SIG`, any case), by number, or
/// `none`.
fn parse_signal(s: &str) -> Result<OnRequest, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(OnRequest(None));
    }
    if let Ok(n) = t.parse::<i32>() {
        // SIGRTMAX is 64 on Linux.
        return if (1..=64).contains(&n) {
            Ok(OnRequest(Some(n)))
        } else {
            Err(format!("signal {n} is out of range (1-64)"))
        };
    }
    let upper = t.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    let n = match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        _ => {
            return Err(format!(
                "{s:?} is not a signal: use a name (TERM, USR1, ...), a number or none"
            ))
        }
    };
    Ok(OnRequest(Some(n)))
}

/// The lock `exec` and `lock` take, and how they wait for it.
#[derive(Debug, Args)]
pub struct LockChoice {
    /// The lock's name (`jobs/nightly`).
    pub name: String,

    /// Fail at once if the lock is held (exit 1 or -E).
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// Wait at most SECS (fractions allowed), then fail (exit 1 or -E);
    /// `--timeout` as in flock(1).
    #[arg(
        short = 'w',
        long,
        visible_alias = "timeout",
        value_name = "SECS",
        value_parser = parse_secs
    )]
    pub wait: Option<Duration>,

    /// The exit code when the lock was not acquired (-n, -w).
    #[arg(short = 'E', long, value_name = "CODE", default_value_t = 1)]
    pub conflict_exit_code: u8,

    /// A fair (first come, first served) mutex.
    #[arg(long, conflicts_with_all = ["semaphore", "read", "write"])]
    pub fair: bool,

    /// Take one permit of a semaphore of N permits.
    #[arg(long, value_name = "N", conflicts_with_all = ["read", "write"])]
    pub semaphore: Option<u32>,

    /// Take the read side of a read-write lock (shared).
    #[arg(long, conflicts_with = "write")]
    pub read: bool,

    /// Take the write side of a read-write lock (exclusive).
    #[arg(long)]
    pub write: bool,
}

/// `distlock exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The lock and how to wait for it.
    #[command(flatten)]
    pub lock: LockChoice,

    /// More names, taken with the first all or nothing (mutexes and fair
    /// mutexes only).
    #[arg(value_name = "NAME")]
    pub more: Vec<String>,

    /// Lease, grace and lost-lease options.
    #[command(flatten)]
    pub run: RunArgs,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `distlock elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The election's name.
    pub name: String,

    /// Print the leader at each change, one line each, until interrupted.
    #[arg(long, conflicts_with_all = ["once", "command", "ttl", "on_lost"])]
    pub observe: bool,

    /// With --observe: one JSON object a line, `{"name": NAME, "leader":
    /// {"id": ID, "term": TERM}}` (`"leader": null` when there is none).
    #[arg(long, requires = "observe")]
    pub json: bool,

    /// Exit after leadership is lost once (exit 75) instead of campaigning again.
    #[arg(long)]
    pub once: bool,

    /// Lease, grace and lost-lease options.
    #[command(flatten)]
    pub run: RunArgs,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required_unless_present = "observe", value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `distlock id`.
#[derive(Debug, Args)]
pub struct IdArgs {
    /// The id generator's name.
    pub name: String,

    /// How many ids to print (1 or more).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = parse_positive)]
    pub count: u64,

    /// Ids reserved per round trip (1 or more).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = parse_positive)]
    pub block: u64,

    /// One JSON object a line: `{"name": NAME, "id": ID}`.
    #[arg(long)]
    pub json: bool,
}

/// `distlock lock`: the lock of `exec`, held without a command.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock and how to wait for it.
    #[command(flatten)]
    pub lock: LockChoice,

    /// Lease TTL in seconds (Redis; ZooKeeper's lease is its session).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub ttl: Option<Duration>,

    /// Print the hold as one JSON object (name, kind, fencing_token, owner,
    /// backend) instead of the token alone.
    #[arg(long)]
    pub json: bool,
}

/// `distlock inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The name.
    pub name: String,

    /// The primitive: mutex, fair, rw, semaphore or election.
    #[arg(long, value_name = "KIND", default_value = "mutex", value_parser = parse_kind)]
    pub kind: PrimitiveKind,

    /// One JSON object on one line instead of a table: name, kind, backend,
    /// held, holders (role, owner, foreign, fencing_token, acquired_at,
    /// acquired_at_unix_ms, lease: ttl | session | no_expiry, lease_left_ms,
    /// session_id), waiters (count, owners), leader (id, term), permits.
    #[arg(long)]
    pub json: bool,
}

/// `distlock unlock`.
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// Seconds to wait for the holders asked to let go (fractions
    /// allowed); with `--force`, `0` evicts at once without asking.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, default_value = "30")]
    pub grace: Duration,

    /// Evict the holders that still hold after the grace period (asks for
    /// confirmation on a terminal unless --yes).
    #[arg(long)]
    pub force: bool,

    /// With --force: do not ask for confirmation.
    #[arg(long, short = 'y', requires = "force")]
    pub yes: bool,

    /// The primitive: mutex, fair, rw, semaphore or election.
    #[arg(long, value_name = "KIND", default_value = "mutex", value_parser = parse_kind)]
    pub kind: PrimitiveKind,

    /// The name.
    pub name: String,
}

/// A whole number, 1 or more: a count of 0 would do nothing and say
/// nothing.
fn parse_positive(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be 1 or more, got 0".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number, 1 or more")),
    }
}

/// Seconds, fractions allowed: `0.5`, `10`.
fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!(
            "{s:?} must be a finite number of seconds, 0 or more"
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

fn parse_kind(s: &str) -> Result<PrimitiveKind, String> {
    s.parse().map_err(|e: distlock::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn seconds_take_fractions_and_refuse_nonsense() {
        assert_eq!(parse_secs("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_secs("10"), Ok(Duration::from_secs(10)));
        for bad in ["-1", "x", "NaN", "inf", "1e300"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn signals_by_name_number_or_none() {
        assert_eq!(parse_signal("TERM"), Ok(OnRequest(Some(libc::SIGTERM))));
        assert_eq!(parse_signal("sigusr1"), Ok(OnRequest(Some(libc::SIGUSR1))));
        assert_eq!(parse_signal("2"), Ok(OnRequest(Some(2))));
        assert_eq!(parse_signal("none"), Ok(OnRequest(None)));
        for bad in ["0", "65", "-1", "TERMINATE", ""] {
            assert!(parse_signal(bad).is_err(), "{bad}");
        }
    }
}
