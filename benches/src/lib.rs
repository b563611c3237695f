//! Criterion benches of distlock (`cargo bench -p distlock-benches`). The
//! benches live in `benches/`; the library part holds what the `contender`
//! binary and the cross-process bench share.

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the
/// machine, the one `time.monotonic_ns()` (Python) and `System.nanoTime()`
/// (Java) read on Linux.
///
/// # Panics
///
/// When `clock_gettime` fails (it cannot for this clock on Linux).
#[must_use]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Polls every future it holds whenever woken (dropping those that
/// finished); never resolves. Drives many waiting `lock()` futures from one
/// task, for the memory figures (the waiters wait on a lock that stays
/// held).
pub struct AllPending<F>(pub Vec<Option<F>>);

impl<F: std::future::Future + Unpin> std::future::Future for AllPending<F> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        for slot in &mut self.0 {
            if slot
                .as_mut()
                .is_some_and(|f| std::pin::Pin::new(f).poll(cx).is_ready())
            {
                *slot = None;
            }
        }
        std::task::Poll::Pending
    }
}
