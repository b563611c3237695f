//! [`PgFence`]: the fence rule on a PostgreSQL row, admitted inside the
//! caller's own transaction.
//!
//! # The table
//!
//! One row per fenced resource ([`PgFence::migrate`] creates it, or run
//! [`DDL`] in your own migrations):
//!
//! ```sql
#![doc = include_str!("postgres/ddl.sql")]
//! ```
//!
//! Tokens are `numeric(20,0)`, so every `u64` (up to 18446744073709551615,
//! past `bigint`'s `i64::MAX`) is stored exactly; they travel as decimal
//! text (`$2::text::numeric`, `highest::text`), so no numeric type of the
//! driver is needed.
//!
//! # The admission
//!
//! [`Fence::admit`] runs one statement on the caller's transaction
//! ([`ADMIT`], with `$1` the resource, `$2` the token as text, `$3`
//! whether it is exclusive):
//!
//! ```sql
#![doc = include_str!("postgres/admit.sql")]
//! ```
//!
//! The `WHERE` of the update is [`Highest::check`]'s rule, the same rule
//! in SQL (a test runs both on the same random histories and compares
//! them): an exclusive token must reach `highest`, a shared one
//! `exclusive`. The statement locks the resource's row (inserted or not:
//! `ON CONFLICT DO UPDATE` locks it even when its `WHERE` is false) until
//! the transaction ends, so:
//!
//! * the admission and the caller's own writes in the same transaction
//!   **commit or roll back together**;
//! * a concurrent transaction admitting on the same resource waits for
//!   this one, then checks against what it committed (under `READ
//!   COMMITTED`, PostgreSQL's default; under `REPEATABLE READ` or
//!   `SERIALIZABLE` it fails with a serialization failure, SQLSTATE
//!   `40001`, instead: retry the transaction).
//!
//! **Admit first, then write.** A refused admission is
//! [`Error::Stale`] and writes nothing; it is no SQL error, so **the
//! transaction stays usable** (a refusal does not abort it). A resource
//! name outside [the rule every fence
//! shares](distlock_core::fence#resource-names) (a NUL byte, which a
//! `text` column cannot hold, any other control character, a reserved
//! shape, ...) is [`Error::InvalidName`] before any statement is sent: the
//! transaction stays usable too. The rule leaves every other character to
//! the database's encoding: use a `UTF8` database (PostgreSQL's usual
//! default), since a character a `LATIN1` or `SQL_ASCII` database cannot
//! store is a server error that aborts the transaction. What you
//! wrote in it *before* `admit` is still in it: drop (roll back) the
//! transaction on `Stale`, do not commit it.
//!
//! # Why tokio-postgres
//!
//! It is async on Tokio, as the rest of distlock; it needs no macros and no
//! database at compile time; and it is the base that `deadpool-postgres`
//! and `bb8-postgres` pool (their connections deref to its
//! [`Client`](tokio_postgres::Client), so `PgFence` works with them as it
//! is). **sqlx** is its own driver: an sqlx user runs [`DDL`] once, checks
//! the resource with [`check_resource`] (the rule every fence shares) and
//! runs [`ADMIT`] on the transaction (`sqlx::query(ADMIT).bind(resource)
//! .bind(token.to_string()).bind(exclusive).fetch_optional(&mut *tx)`), a
//! row back meaning admitted and none meaning refused (then read the row
//! for the `highest` to report). The constants are public for that.
//!
//! [`Highest::check`]: distlock_core::fence::Highest::check

use async_trait::async_trait;
use distlock_core::fence::{check_resource, Fence, FenceToken, Highest};
use distlock_core::{Error, Result};
pub use tokio_postgres;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row, Transaction};

/// The table's DDL, for the default table name `distlock_fence`.
pub const DDL: &str = include_str!("postgres/ddl.sql");

/// The admission statement (see [the module docs](self)), for the
/// default table name.
pub const ADMIT: &str = include_str!("postgres/admit.sql");

/// The read of a resource's numbers, for the default table name.
pub const HIGHEST: &str = include_str!("postgres/highest.sql");

const DEFAULT_TABLE: &str = "distlock_fence";
const BACKEND: &str = "postgresql";

/// The fence of PostgreSQL resources: admits tokens on the caller's
/// transaction (see [the module docs](self)).
///
/// # Example
///
/// ```no_run
/// # mod distlock {
/// #     pub use distlock_core::*;
/// #     pub mod fence { pub use distlock_core::fence::*; pub use distlock_fence::postgres; }
/// # }
/// use distlock::fence::{Fence, FenceToken};
/// use distlock::fence::postgres::{PgFence, tokio_postgres};
///
/// # async fn run(mut db: tokio_postgres::Client, guard: distlock::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = PgFence::new();
/// fence.migrate(&db).await?; // once: CREATE TABLE IF NOT EXISTS distlock_fence
///
/// let mut tx = db.transaction().await?;
/// // Admit first: refused (Stale) if a newer holder of "orders/42" wrote.
/// fence.admit(&mut tx, "orders/42", FenceToken::of(&guard)).await?;
/// tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
/// tx.commit().await?; // the write and the admission commit together
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PgFence {
    table: String,
    ddl: String,
    admit: String,
    highest: String,
}

impl Default for PgFence {
    fn default() -> Self {
        Self::new()
    }
}

impl PgFence {
    /// The fence on the table `distlock_fence`.
    #[must_use]
    pub fn new() -> Self {
        Self::build(DEFAULT_TABLE)
    }

    /// The fence on another table (in the connection's `search_path`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] unless `table` is 1 to 63 ASCII lower-case
    /// letters, digits and `_`, not starting with a digit (it is put in
    /// the SQL as an identifier).
    pub fn with_table(table: &str) -> Result<Self> {
        let ok = !table.is_empty()
            && table.len() <= 63
            && !table.starts_with(|c: char| c.is_ascii_digit())
            && table
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(Error::InvalidName {
                name: table.chars().take(64).collect(),
                reason: "a fence table is 1-63 of [a-z0-9_], not starting with a digit",
            });
        }
        Ok(Self::build(table))
    }

    fn build(table: &str) -> Self {
        let on = |sql: &str| sql.replace(DEFAULT_TABLE, table);
        PgFence {
            table: table.to_owned(),
            ddl: on(DDL),
            admit: on(ADMIT),
            highest: on(HIGHEST),
        }
    }

    /// The table's name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the fence table if it does not exist (idempotent).
    ///
    /// # Errors
    ///
    /// The server's errors ([`Error::Server`], [`Error::NotAllowed`]
    /// without the `CREATE` privilege, [`Error::Connection`]).
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future may leave the table created or not; calling
    /// it again is harmless.
    pub async fn migrate<C: GenericClient + Sync>(&self, client: &C) -> Result<()> {
        client.batch_execute(&self.ddl).await.map_err(map_error)
    }

    /// The resource's numbers as committed, read on any client or
    /// transaction (one typed statement, [`HIGHEST`]): what
    /// [`Fence::highest`] reads, outside a transaction of yours. After a
    /// `COMMIT` whose answer was lost (a connection error: the commit may
    /// or may not have happened), it says what the table holds now; to
    /// finish the work, retry the whole transaction with the same token:
    /// the same holder's token is admitted again (make its write
    /// idempotent), and a newer holder's admission refuses it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad resource name; the server's errors
    /// as [`map_error`] maps them.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn read_highest<C: GenericClient + Sync>(
        &self,
        client: &C,
        resource: &str,
    ) -> Result<Highest> {
        self.read(client, resource).await
    }

    async fn read<C: GenericClient + Sync>(&self, client: &C, resource: &str) -> Result<Highest> {
        let resource = check_resource(resource)?;
        let row = client
            .query_typed_opt(&self.highest, &[(&resource, Type::TEXT)])
            .await
            .map_err(map_error)?;
        row.map_or(Ok(Highest::default()), |r| numbers(&r))
    }
}

#[async_trait]
impl<'t> Fence<Transaction<'t>> for PgFence {
    async fn admit(
        &self,
        tx: &mut Transaction<'t>,
        resource: &str,
        token: FenceToken,
    ) -> Result<Highest> {
        let resource = check_resource(resource)?;
        let token = token.check()?;
        let text = token.token().to_string();
        let exclusive = token.is_exclusive();
        // Typed parameters: one round trip (Parse, Bind, Execute in one
        // go), not a prepare first.
        let row = tx
            .query_typed_opt(
                &self.admit,
                &[
                    (&resource, Type::TEXT),
                    (&text, Type::TEXT),
                    (&exclusive, Type::BOOL),
                ],
            )
            .await
            .map_err(map_error)?;
        match row {
            Some(row) => numbers(&row),
            None => {
                // Refused: the row exists and is locked by us, so this
                // read sees the numbers the rule compared with.
                let now = self.read(&*tx, resource).await?;
                Err(Error::Stale {
                    token: token.token(),
                    highest: now.bar(token),
                })
            }
        }
    }

    async fn highest(&self, tx: &mut Transaction<'t>, resource: &str) -> Result<Highest> {
        self.read(&*tx, resource).await
    }
}

fn numbers(row: &Row) -> Result<Highest> {
    let field = |i: usize| -> Result<u64> {
        let text: &str = row.try_get(i).map_err(map_error)?;
        text.parse().map_err(|_| {
            Error::server(
                BACKEND,
                format!("fence table holds {text:?}, not a u64 token"),
            )
        })
    };
    Ok(Highest {
        token: field(0)?,
        exclusive: field(1)?,
    })
}

/// Maps a driver error as the fence does, for the caller's own statements
/// in a function that returns `distlock::Result`: a database error by its
/// SQLSTATE (class 28, authorization, and 42501, privilege →
/// [`Error::NotAllowed`]; any other → [`Error::Server`], its `source()`
/// the driver's error with the code: `40001` is a serialization failure,
/// retry the transaction), anything else (I/O, a closed connection) →
/// [`Error::Connection`].
#[must_use]
pub fn map_error(e: tokio_postgres::Error) -> Error {
    match e.code().map(tokio_postgres::error::SqlState::code) {
        Some(code) if code.starts_with("28") || code == "42501" => Error::NotAllowed {
            backend: BACKEND,
            source: e.into(),
        },
        Some(_) => Error::server(BACKEND, e),
        None => Error::connection(BACKEND, e),
    }
}
