//! The Lua scripts, kept in `.lua` files and run by EVALSHA (loaded on
//! NOSCRIPT by the client). The read-write lock's and the semaphore's
//! acquire and release scripts start with their `…_wake.lua` prelude (who may
//! get in, and the addressed wake-ups).

use std::sync::LazyLock;

use redis::Script;

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/extend.lua")));
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fair_acquire.lua")));
pub(crate) static FAIR_LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fair_leave.lua")));
pub(crate) static ELECT_LEADER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/elect_leader.lua")));
pub(crate) static RW_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rw_wake.lua"),
        include_str!("scripts/rw_acquire.lua")
    ))
});
pub(crate) static RW_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rw_wake.lua"),
        include_str!("scripts/rw_release.lua")
    ))
});
pub(crate) static RW_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/rw_extend.lua")));
pub(crate) static SEM_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/sem_wake.lua"),
        include_str!("scripts/sem_acquire.lua")
    ))
});
pub(crate) static SEM_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/sem_wake.lua"),
        include_str!("scripts/sem_release.lua")
    ))
});
pub(crate) static SEM_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/sem_extend.lua")));
pub(crate) static REDLOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/redlock_acquire.lua")));
pub(crate) static REDLOCK_RAISE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/redlock_raise.lua")));
pub(crate) static INSPECT_LOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect_lock.lua")));
pub(crate) static INSPECT_QUEUED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect_queued.lua")));
pub(crate) static FORCE_LOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/force_lock.lua")));
pub(crate) static RW_FORCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/rw_wake.lua"),
        include_str!("scripts/rw_force.lua")
    ))
});
pub(crate) static SEM_FORCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/sem_wake.lua"),
        include_str!("scripts/sem_force.lua")
    ))
});
