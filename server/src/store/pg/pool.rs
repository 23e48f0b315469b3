//! The driver's runtime and a small connection pool.
//!
//! The store traits are synchronous and are called from the blocking pool, from plain threads
//! (the recorder, the start-up housekeeping) and, at start-up, from an async task
//! (`Server::bind`). So the connections live on a runtime of their own, on one thread that only
//! drives PostgreSQL I/O, and a call hands its query there and waits on a channel: never
//! `block_on` on the caller's runtime (which panics on an async worker). When the waiting thread
//! is a worker of a multi-threaded runtime, it waits inside `block_in_place`, so the worker's
//! other tasks move to another thread meanwhile.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, Config, NoTls};
use tracing::warn;

use crate::store::StoreError;

/// How to reach the database and how many connections to keep.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Connections at most.
    pub size: usize,
    /// A connection attempt fails after this long.
    pub connect_timeout: Duration,
    /// One store operation (queries and waiting for a connection) fails after this long.
    pub op_timeout: Duration,
}

/// How much longer than an operation's time-out one of its statements may run in the database.
const STATEMENT_AFTER_OPERATION: Duration = Duration::from_millis(500);

/// How long the database lets one of this host's transactions sit idle before it ends it.
/// A transaction's statements follow each other at once (no object is written inside one), so
/// only a host that stopped mid-transaction (a paused VM, a stopped process) reaches it. Its
/// locks went with it before only when it woke: a write of a session reads the lease row
/// `FOR KEY SHARE`, so another host's take-over of the session waited on the sleeper, its calls
/// with it.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// The pool: idle connections, and a permit per connection that may exist.
pub(super) struct Pool {
    config: Config,
    idle: Mutex<Vec<Client>>,
    permits: Arc<Semaphore>,
    options: PoolOptions,
    /// Where the database is, for messages (never the password).
    pub(super) name: String,
}

/// A connection taken from the pool for one operation ([`Pool::with_conn`]).
///
/// When it is dropped it goes into its operation's hand-back slot, and from there back to the
/// idle list only once the operation finished. An operation dropped midway (its time-out) drops
/// the slot with the connection in it, which closes it: its state is not known (a query or a
/// transaction still open on the server), and the server rolls back what a closed connection
/// left open.
pub(super) struct Conn {
    taken: Option<(Client, OwnedSemaphorePermit)>,
    hand_back: Arc<Mutex<Option<(Client, OwnedSemaphorePermit)>>>,
}

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.taken.as_ref().expect("held until drop").0
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.taken.as_mut().expect("held until drop").0
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take()
            && !taken.0.is_closed()
        {
            *self.hand_back.lock().unwrap_or_else(|p| p.into_inner()) = Some(taken);
        }
    }
}

impl Pool {
    pub(super) fn new(config: Config, options: PoolOptions, name: String) -> Pool {
        Pool {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(options.size.max(1))),
            options,
            name,
        }
    }

    /// Runs `f` with a connection (an idle one, or a new one bounded by the connect timeout),
    /// which goes back to the idle list when `f` finished, not when it was dropped midway.
    pub(super) async fn with_conn<T, F, Fut>(self: &Arc<Pool>, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let hand_back = Arc::new(Mutex::new(None));
        let conn = self.get(hand_back.clone()).await?;
        let out = f(conn).await;
        let back = hand_back.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((client, _permit)) = back {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(client);
        }
        out
    }

    async fn get(
        self: &Arc<Pool>,
        hand_back: Arc<Mutex<Option<(Client, OwnedSemaphorePermit)>>>,
    ) -> Result<Conn, StoreError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Database("the connection pool is closed".into()))?;
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|c| !c.is_closed());
            idle.pop()
        };
        let client = match idle {
            Some(client) => client,
            None => self.connect().await?,
        };
        Ok(Conn {
            taken: Some((client, permit)),
            hand_back,
        })
    }

    async fn connect(&self) -> Result<Client, StoreError> {
        let mut config = self.config.clone();
        config.connect_timeout(self.options.connect_timeout);
        // The driver's own time-out covers each attempt; this one covers them all (several
        // hosts, DNS).
        let attempt = tokio::time::timeout(
            self.options.connect_timeout + Duration::from_secs(1),
            config.connect(NoTls),
        );
        let (client, connection) = match attempt.await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                return Err(StoreError::Database(format!(
                    "cannot connect to PostgreSQL at {}: {}",
                    self.name,
                    describe(&e)
                )));
            }
            Err(_) => {
                return Err(StoreError::Database(format!(
                    "cannot connect to PostgreSQL at {}: no answer within {:?}",
                    self.name, self.options.connect_timeout
                )));
            }
        };
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!("PostgreSQL connection to {name} ended: {}", describe(&e));
            }
        });
        // A statement runs hardly longer than the store waits for its operation: one it
        // stopped waiting for (and whose connection it dropped) is cancelled by the database,
        // which notices a closed connection only when it sends (a search over a user's every
        // conversation ran on for minutes after its request had failed). Half a second more,
        // so that the store's own time-out, which says what took too long, comes first.
        client
            .batch_execute(&format!(
                "SET idle_in_transaction_session_timeout = {}; SET statement_timeout = {}",
                IDLE_IN_TRANSACTION.as_millis(),
                (self.options.op_timeout + STATEMENT_AFTER_OPERATION).as_millis()
            ))
            .await
            .map_err(|e| {
                StoreError::Database(format!(
                    "cannot set up a PostgreSQL connection to {}: {}",
                    self.name,
                    describe(&e)
                ))
            })?;
        Ok(client)
    }
}

/// A driver error with its cause (the database's own message when it sent one).
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            text
        }
    }
}

/// The thread that drives the connections, and a way to run work on it.
pub(super) struct Driver {
    handle: tokio::runtime::Handle,
    /// Dropping it ends the driver thread (and the runtime, on that thread).
    _stop: tokio::sync::oneshot::Sender<()>,
    op_timeout: Duration,
}

impl Driver {
    pub(super) fn start(op_timeout: Duration) -> Result<Driver, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::Database(format!("cannot start the PostgreSQL driver: {e}"))
            })?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("postgres".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| {
                StoreError::Database(format!("cannot start the PostgreSQL driver: {e}"))
            })?;
        Ok(Driver {
            handle,
            _stop: stop,
            op_timeout,
        })
    }

    /// Runs `work` on the driver thread and waits for it, at most the operation time-out.
    pub(super) fn run<T, Fut>(&self, work: Fut) -> Result<T, StoreError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let limit = self.op_timeout;
        self.handle.spawn(async move {
            let out = match tokio::time::timeout(limit, work).await {
                Ok(out) => out,
                Err(_) => Err(StoreError::Database(format!(
                    "a PostgreSQL operation took longer than {limit:?}"
                ))),
            };
            let _ = tx.send(out);
        });
        let wait = move || {
            rx.recv().unwrap_or_else(|_| {
                Err(StoreError::Database(
                    "the PostgreSQL driver stopped during an operation".into(),
                ))
            })
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        }
    }
}
