//! The id counter (the crate docs, "Ids").

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{with_timeout, IdSource};
use distlock_core::{Error, Name, Result};
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::context::Context;
use crate::error::from_zk;
use crate::node::{acls, make_parents, CONTAINER_OWNER};

/// The counter of one id generator.
pub(crate) struct ZkIds {
    pub(crate) ctx: Arc<Context>,
    pub(crate) name: Name,
    pub(crate) node: String,
}

impl ZkIds {
    fn conflict(&self, expected: &'static str) -> Error {
        Error::Conflict {
            what: format!("zookeeper node {:?}", self.node),
            expected,
        }
    }
}

#[async_trait]
impl IdSource for ZkIds {
    async fn reserve(&self, n: u64) -> Result<u64> {
        let timeout = self.ctx.timeout;
        let mut attempt: u32 = 0;
        loop {
            let session = self.ctx.sessions.get().await?;
            let client = &session.client;
            match with_timeout("get", timeout, client.get_data(&self.node)).await? {
                Ok((data, stat)) => {
                    if stat.ephemeral_owner != 0 {
                        return Err(self.conflict(if stat.ephemeral_owner == CONTAINER_OWNER {
                            "id counter (it is a lock's container node)"
                        } else {
                            "id counter (it is ephemeral)"
                        }));
                    }
                    if stat.num_children > 0 && data.len() != 8 {
                        // A lock's directory (made persistent by another
                        // client: kazoo's `ensure_path`, an operator). Its
                        // empty data would read as a counter at 0, and the
                        // 8 bytes written would make every lock on the name
                        // refused from then on. A persistent node holding a
                        // counter is one, children or not: they are the
                        // directories of names below it (a lock `a/b`
                        // under the counter `a`), which never read its data.
                        return Err(
                            self.conflict("id counter (it has children: a lock's directory)")
                        );
                    }
                    let current = match data.len() {
                        0 => 0,
                        8 => u64::from_be_bytes(data.try_into().unwrap_or_default()),
                        _ => return Err(self.conflict("id counter (8 bytes, big-endian)")),
                    };
                    let next = current.checked_add(n).ok_or_else(|| Error::Exhausted {
                        name: self.name.to_string(),
                    })?;
                    let write =
                        client.set_data(&self.node, &next.to_be_bytes(), Some(stat.version));
                    match with_timeout("set", timeout, write).await? {
                        Ok(_) => return Ok(next),
                        Err(ZkError::BadVersion) => {
                            // Someone else took this block: back off a little
                            // (jittered, growing) and read again.
                            attempt = attempt.saturating_add(1);
                            let ceiling = 1u64 << attempt.min(8);
                            let jitter = uuid::Uuid::new_v4().as_u128() % u128::from(ceiling);
                            let micros = 50 * (1 + u64::try_from(jitter).unwrap_or(0));
                            tokio::time::sleep(Duration::from_micros(micros)).await;
                        }
                        Err(e) => return Err(from_zk("set", timeout, e)),
                    }
                }
                Err(ZkError::NoNode) => {
                    let create = CreateMode::Persistent.with_acls(acls(self.ctx.authenticated));
                    let zero = 0u64.to_be_bytes();
                    match with_timeout("create", timeout, client.create(&self.node, &zero, &create))
                        .await?
                    {
                        Ok(_) | Err(ZkError::NodeExists) => {}
                        Err(ZkError::NoNode) => {
                            make_parents(&session, &self.node, self.ctx.authenticated, timeout)
                                .await?;
                        }
                        Err(e) => return Err(from_zk("create", timeout, e)),
                    }
                }
                Err(e) => return Err(from_zk("get", timeout, e)),
            }
        }
    }
}
