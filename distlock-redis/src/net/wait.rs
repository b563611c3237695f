//! `WAIT` behind a write: the script and the `WAIT` in one pipeline, on one
//! socket, so the `WAIT` counts the replicas that have the write.

use distlock_core::Error;
use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, ScriptInvocation, Value};

use crate::options::WaitReplicas;

/// `WAIT replicas timeout-ms`.
pub(crate) fn wait_cmd(wait: WaitReplicas) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(wait.replicas)
        .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
    cmd
}

/// Runs `invocation` on `conn` with `wait` appended to each of its scripts'
/// `EVALSHA` / `EVAL` (the client retries with the script loaded after a
/// `NOSCRIPT`), and returns what the last `WAIT` answered (0 when it did not
/// answer a number).
pub(crate) async fn with_wait<C: ConnectionLike + Send, T: FromRedisValue>(
    mut conn: C,
    wait: &Cmd,
    invocation: &ScriptInvocation<'_>,
) -> (redis::RedisResult<T>, u32) {
    let mut acked = WithWait {
        inner: &mut conn,
        wait,
        acked: 0,
    };
    let result = invocation.invoke_async(&mut acked).await;
    let acked = acked.acked;
    (result, acked)
}

/// A connection that sends `WAIT` right behind every script call, in one
/// pipeline, and keeps its answer.
struct WithWait<'a, C> {
    inner: &'a mut C,
    wait: &'a Cmd,
    acked: u32,
}

/// `EVALSHA sha …` of one of our scripts as `EVAL source …`: with a `WAIT`
/// behind it, a `NOSCRIPT` (a restarted server) would cost a second `WAIT`
/// on the resend, so the script's body goes along instead (the server
/// caches it by its SHA1 all the same).
fn as_eval(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter();
    match args.next() {
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"EVALSHA") => {}
        _ => return None,
    }
    let Some(redis::Arg::Simple(sha)) = args.next() else {
        return None;
    };
    let source = crate::scripts::source_of(std::str::from_utf8(sha).ok()?)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for arg in args {
        match arg {
            redis::Arg::Simple(bytes) => {
                eval.arg(bytes);
            }
            _ => return None,
        }
    }
    Some(eval)
}

fn is_script(cmd: &Cmd) -> bool {
    matches!(
        cmd.args_iter().next(),
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")
    )
}

impl<C: ConnectionLike + Send> ConnectionLike for WithWait<'_, C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if !is_script(cmd) {
                return self.inner.req_packed_command(cmd).await;
            }
            let mut pipe = redis::pipe();
            pipe.add_command(as_eval(cmd).unwrap_or_else(|| cmd.clone()))
                .add_command(self.wait.clone());
            let mut replies = self.inner.req_packed_commands(&pipe, 0, 2).await?;
            let (Some(ack), Some(reply)) = (replies.pop(), replies.pop()) else {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "a script and WAIT pipeline returned fewer than two replies",
                )));
            };
            self.acked = match ack {
                Value::Int(n) => u32::try_from(n).unwrap_or(0),
                _ => 0,
            };
            match reply {
                Value::ServerError(e) => Err(e.into()),
                reply => Ok(reply),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// The error for a write `wait` asked of replicas that fewer acknowledged.
pub(crate) fn not_replicated(what: String, acked: u32, wait: WaitReplicas) -> Error {
    Error::NotReplicated {
        what,
        acked,
        wanted: wait.replicas,
        after: wait.timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_scripts_go_as_eval_with_their_body_and_others_are_left_alone() {
        let sha = crate::scripts::ACQUIRE.get_hash().to_owned();
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(&sha)
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg("tok")
            .arg(30_000);
        let eval = as_eval(&evalsha).expect("one of ours");
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"EVAL");
        assert_eq!(args[1], crate::scripts::source_of(&sha).unwrap().as_bytes());
        assert_eq!(&args[2..], [&b"2"[..], b"k1", b"k2", b"tok", b"30000"]);
        let mut foreign = redis::cmd("EVALSHA");
        foreign
            .arg("0123456789abcdef0123456789abcdef01234567")
            .arg(0);
        assert!(as_eval(&foreign).is_none());
        assert!(as_eval(&redis::cmd("PING")).is_none());
    }
}
