//! The tracing events of the in-process backend carry the owner identity
//! (a test binary of its own: the capturing subscriber is global).
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_events_carry_the_owner() {
    let provider = distlock_core::mem::MemProvider::new()
        .with_owner_label("traced-job")
        .unwrap();
    test_support::metrics::tracing_events_carry_the_owner(&provider, |_| async { None }).await;
}
