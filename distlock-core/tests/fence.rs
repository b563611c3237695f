//! The fence conformance suite against the in-process fence.
// Tests unwrap: a failure is a panic with the error in the message.
#![allow(clippy::unwrap_used)]

test_support::fence_conformance_suite!(test_support::fence_conformance::MemFenceFixture::default());
