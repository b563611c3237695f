//! The Lua scripts, kept in `.lua` files and run by EVALSHA (loaded on
//! NOSCRIPT by the client), or by EVAL when a `WAIT` rides behind them (so a
//! NOSCRIPT never costs a second `WAIT`). Each script file opens with its
//! KEYS, ARGV and returns; the shared rules are preludes (functions only),
//! concatenated in front of the scripts that use them, in this order:
//!
//! * `holds.lua`: what the mutex's lock key holds (a distlock hold
//!   `<token>|<owner>`, a hand-over reservation, another kind's marker, a
//!   foreign value);
//! * `kind.lua`: one name is one lock (the other kinds' check and this
//!   kind's marker in the lock key), for the read-write lock, the semaphore
//!   and the election (`fair_acquire`);
//! * `fence.lua`: the fencing rule, the one place a single-master token is
//!   taken (Redlock's masters keep their own, `redlock_acquire.lua`);
//! * `rw_admit.lua` / `sem_admit.lua`: who the read-write lock or the
//!   semaphore admits;
//! * `queue.lua`: the queue library: the fair queue's purge (its dead
//!   waiters and its live head, for every script of the fair mutex and the
//!   election that reads the head), and the read-write lock's and the
//!   semaphore's queue (addressed wake-ups, purges, expiries);
//! * `line_pop.lua`: the first live provider in a plain mutex's line;
//! * `asked.lua`: a renewal's answer, extended or extended and asked to
//!   release (`request_release.lua`'s mark), for every kind's extend.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::Script;

/// Declares each script once: its source (for `EVAL`, see [`source_of`])
/// and its `Script` (for `EVALSHA`).
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident = $src:expr;)+) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| Script::new($src));
        )+
        /// Every script's source by its SHA1.
        static SOURCES: LazyLock<HashMap<String, &'static str>> = LazyLock::new(|| {
            [$($src),+]
                .into_iter()
                .map(|src| (Script::new(src).get_hash().to_owned(), src))
                .collect()
        });
    };
}

scripts! {
    ACQUIRE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/fence.lua"), include_str!("scripts/acquire.lua"));
    RELEASE = concat!(include_str!("scripts/queue.lua"), include_str!("scripts/release.lua"));
    MUTEX_RELEASE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/line_pop.lua"), include_str!("scripts/mutex_release.lua"));
    MUTEX_PASS = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/line_pop.lua"), include_str!("scripts/mutex_pass.lua"));
    LINE_ALIVE = include_str!("scripts/line_alive.lua");
    EXTEND = concat!(include_str!("scripts/asked.lua"), include_str!("scripts/extend.lua"));
    FAIR_ACQUIRE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/fence.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/fair_acquire.lua"));
    FAIR_LEAVE = concat!(include_str!("scripts/queue.lua"), include_str!("scripts/fair_leave.lua"));
    ELECT_LEADER = include_str!("scripts/elect_leader.lua");
    RW_ACQUIRE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/fence.lua"), include_str!("scripts/rw_admit.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/rw_acquire.lua"));
    RW_RELEASE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/rw_admit.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/rw_release.lua"));
    RW_EXTEND = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/asked.lua"), include_str!("scripts/rw_extend.lua"));
    SEM_ACQUIRE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/fence.lua"), include_str!("scripts/sem_admit.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/sem_acquire.lua"));
    SEM_RELEASE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/sem_admit.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/sem_release.lua"));
    SEM_EXTEND = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/asked.lua"), include_str!("scripts/sem_extend.lua"));
    REDLOCK_ACQUIRE = include_str!("scripts/redlock_acquire.lua");
    REDLOCK_RAISE = include_str!("scripts/redlock_raise.lua");
    REDLOCK_INSPECT = include_str!("scripts/redlock_inspect.lua");
    REDLOCK_EXTEND = include_str!("scripts/redlock_extend.lua");
    INSPECT_LOCK = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/inspect_lock.lua"));
    INSPECT_QUEUED = include_str!("scripts/inspect_queued.lua");
    REQUEST_RELEASE = include_str!("scripts/request_release.lua");
    FORCE_LOCK = concat!(include_str!("scripts/fence.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/force_lock.lua"));
    RW_FORCE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/fence.lua"), include_str!("scripts/rw_admit.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/rw_force.lua"));
    SEM_FORCE = concat!(include_str!("scripts/holds.lua"), include_str!("scripts/kind.lua"), include_str!("scripts/fence.lua"), include_str!("scripts/sem_admit.lua"), include_str!("scripts/queue.lua"), include_str!("scripts/sem_force.lua"));
}

/// The source of one of our scripts by its SHA1 (what `EVALSHA` names).
pub(crate) fn source_of(sha: &str) -> Option<&'static str> {
    SOURCES.get(sha).copied()
}
