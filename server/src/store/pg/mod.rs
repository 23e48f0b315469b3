//! The PostgreSQL store: every store trait on PostgreSQL, artifact content behind [`Blobs`].
//!
//! Records are rows (see `0001_initial.sql`); the schema is versioned by embedded migrations
//! applied at start (see [`migrate`]). The connections are driven on a thread of their own
//! ([`pool`]), so the synchronous traits can be called from any thread, async workers included,
//! without blocking a runtime on itself.
//!
//! A session's primary workspace stays a directory on this host
//! (`<data_dir>/sessions/<id>/workspace`): it is what the tools work in, not a record.

pub mod lease;
mod pool;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Config, GenericClient, Row};

pub use lease::{Host, Lease};
pub use pool::PoolOptions;
use pool::{Driver, Pool, describe};

use super::blobs::Blobs;
use super::history::{History, HistoryMessage, Role};
use super::*;
use crate::fsutil::{create_workspace_root, now_rfc3339};

/// The schema versions this binary knows, in order: (version, name, SQL).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "initial", include_str!("0001_initial.sql")),
    (2, "leases", include_str!("0002_leases.sql")),
    (3, "kept folders", include_str!("0003_kept_folders.sql")),
    (
        4,
        "artifacts by session",
        include_str!("0004_artifacts_by_session.sql"),
    ),
    (
        5,
        "artifacts by blob key",
        include_str!("0005_artifacts_by_blob_key.sql"),
    ),
];

/// The artifacts of `session` that rows of `id, meta, blob_key` hold, in their order; one that
/// cannot be read is skipped with a warning.
fn readable_artifacts<'a>(
    session: &'a str,
    rows: &'a [tokio_postgres::Row],
) -> impl Iterator<Item = ArtifactMeta> + 'a {
    rows.iter().filter_map(move |r| {
        artifact_of(session, r.get(0), r.get(1), r.get(2))
            .map_err(|e| tracing::warn!("skipping an artifact: {e}"))
            .ok()
    })
}

/// The audit records of session `id` that rows of `record` (first) hold, in their order; one
/// that cannot be read is skipped with a warning (and not read again: a cursor passes it).
fn readable_audit<'a>(
    id: &'a str,
    rows: &'a [tokio_postgres::Row],
) -> impl Iterator<Item = AuditRecord> + 'a {
    rows.iter().filter_map(move |r| {
        serde_json::from_str(r.get::<_, &str>(0))
            .map_err(|e| tracing::warn!("session {id}: skipping an unreadable audit record: {e}"))
            .ok()
    })
}

/// In one read-only snapshot: how many rows `count` counts for session `id`, and the rows
/// `page` gives for it at (`OFFSET`, `LIMIT`) `at`, so that the total and the page agree.
async fn counted_page(
    c: &mut pool::Conn,
    count: &str,
    page: &str,
    id: &str,
    (offset, limit): (i64, i64),
) -> Result<(i64, Vec<tokio_postgres::Row>), StoreError> {
    let tx = c
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)?;
    let total: i64 = tx.query_one(count, &[&id]).await.map_err(db)?.get(0);
    let rows = tx.query(page, &[&id, &offset, &limit]).await.map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok((total, rows))
}

/// What the `kept` column holds: a session's focus and folders ([`SessionMeta::folders`]).
#[derive(Default, Serialize, Deserialize)]
struct Kept {
    #[serde(default)]
    focus: Option<String>,
    #[serde(default)]
    folders: Vec<KeptFolder>,
}

/// The `kept` column of `meta`: NULL when it has neither focus nor folders.
fn kept_of(meta: &SessionMeta) -> Option<String> {
    if meta.focus.is_none() && meta.folders.is_empty() {
        return None;
    }
    serde_json::to_string(&Kept {
        focus: meta.focus.clone(),
        folders: meta.folders.clone(),
    })
    .ok()
}

/// A session's record as the parameters `$1` to `$8` of a statement of the `sessions` table:
/// id, name, owner, created, last active, provider, model, and `kept` (the session's focus
/// and kept folders, [`kept_of`]).
fn session_row<'a>(
    m: &'a SessionMeta,
    kept: &'a Option<String>,
) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 8] {
    [
        &m.id,
        &m.name,
        &m.owner,
        &m.created_at,
        &m.last_active,
        &m.provider,
        &m.model,
        kept,
    ]
}

/// The store on PostgreSQL.
pub struct PgStore {
    driver: Driver,
    pool: Arc<Pool>,
    /// One connection of the host's lease renewal alone ([`PgStore::with_renewal`]).
    renewal: Arc<Pool>,
    blobs: Arc<dyn Blobs>,
    data_dir: PathBuf,
    max_devices_per_user: usize,
    /// This host, as leases name it.
    host: Host,
    /// The leases this host holds.
    held: lease::Held,
    /// Told of each session whose lease this host finds lost ([`PgStore::on_lease_lost`]).
    on_lost: std::sync::OnceLock<lease::LostHook>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &self.pool.name)
            .finish_non_exhaustive()
    }
}

/// A database error as a store error: a unique or foreign key violation names what was refused.
fn db(e: tokio_postgres::Error) -> StoreError {
    StoreError::Database(describe(&e))
}

/// Reads `url` (a `postgres://` URL or a `key=value` string) and fills what it leaves out from
/// the usual `PG*` variables in `vars` (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
/// `PGDATABASE`). Returns the configuration and a name for messages (without the password).
pub fn parse_url(
    url: &str,
    vars: impl Fn(&str) -> Option<String>,
) -> Result<(Config, String), StoreError> {
    let mut config: Config = url.parse().map_err(|e: tokio_postgres::Error| {
        StoreError::Invalid(format!(
            "the store URL is not a PostgreSQL connection string (postgres://USER@HOST:PORT/DB): {}",
            describe(&e)
        ))
    })?;
    if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
        return Err(StoreError::Invalid(
            "the store URL asks for TLS (sslmode=require), which this version does not speak to \
             PostgreSQL: reach the database over a private network or a Unix socket"
                .into(),
        ));
    }
    if config.get_hosts().is_empty() {
        let host = vars("PGHOST").unwrap_or_else(|| "localhost".into());
        for h in host.split(',') {
            config.host(h);
        }
    }
    if config.get_ports().is_empty()
        && let Some(port) = vars("PGPORT")
    {
        let port: u16 = port
            .parse()
            .map_err(|_| StoreError::Invalid(format!("PGPORT `{port}` is not a port number")))?;
        config.port(port);
    }
    if config.get_user().is_none() {
        match vars("PGUSER") {
            Some(user) => {
                config.user(&user);
            }
            None => {
                return Err(StoreError::Invalid(
                    "the store URL names no user: put it in the URL (postgres://USER@HOST/DB) \
                     or in PGUSER"
                        .into(),
                ));
            }
        }
    }
    if config.get_password().is_none()
        && let Some(password) = vars("PGPASSWORD")
    {
        config.password(password);
    }
    if config.get_dbname().is_none()
        && let Some(db) = vars("PGDATABASE")
    {
        config.dbname(&db);
    }
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let name = format!(
        "{}:{port}/{}",
        hosts.join(","),
        config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or_default()
    );
    Ok((config, name))
}

impl PgStore {
    /// Connects to the database at `url` (see [`parse_url`]; `PG*` variables from the
    /// environment), applies the migrations this binary has, and keeps artifact content in
    /// `blobs`. Fails with a clear error, within the connect time-out, when the URL is bad, the
    /// database cannot be reached, or its schema is newer than this binary knows.
    pub fn connect(
        url: &str,
        data_dir: &Path,
        blobs: Arc<dyn Blobs>,
        options: PoolOptions,
    ) -> Result<PgStore, StoreError> {
        let (config, name) = parse_url(url, |k| std::env::var(k).ok())?;
        let driver = Driver::start(options.op_timeout)?;
        let renewal = Arc::new(Pool::new(
            config.clone(),
            PoolOptions {
                size: 1,
                ..options.clone()
            },
            name.clone(),
        ));
        let pool = Arc::new(Pool::new(config, options, name));
        let store = PgStore {
            driver,
            pool,
            renewal,
            blobs,
            data_dir: data_dir.to_path_buf(),
            max_devices_per_user: crate::config::Quotas::default().max_devices_per_user,
            host: Host::new("", Duration::from_secs(10)),
            held: lease::Held::default(),
            on_lost: std::sync::OnceLock::new(),
        };
        let pool = store.pool.clone();
        store.driver.run(async move {
            pool.with_conn(|mut conn| async move { migrate(&mut conn, MIGRATIONS).await })
                .await
        })?;
        Ok(store)
    }

    /// Remembers at most `max` devices per user (at least 1), as [`FsStore`] does.
    pub fn with_max_devices_per_user(mut self, max: usize) -> PgStore {
        self.max_devices_per_user = max.max(1);
        self
    }

    /// Where the database is (host, port, database; never the password).
    pub fn name(&self) -> &str {
        &self.pool.name
    }

    /// Removes the artifact content no row names that was written at least `grace` ago (see
    /// [`super::blobs::orphans`]): what a crash between a content write and its row left, or a
    /// delete whose content removal failed after its rows were gone. A page of
    /// [`super::blobs::LIST_PAGE`] keys at a time ([`PgStore::sweep_orphans_paged`]).
    pub fn sweep_orphans(&self, grace: Duration) -> Result<super::blobs::Swept, StoreError> {
        self.sweep_orphans_paged(grace, super::blobs::LIST_PAGE)
    }

    /// [`PgStore::sweep_orphans`] in pages of `page` keys: each page of content is listed, then
    /// the rows that name its keys are read (by the `blob_key` index), so a row committed
    /// meanwhile is seen; neither the bucket's keys nor the rows are ever held whole (the sweep
    /// read every row, and listed the whole bucket in one operation bound by one time-out).
    pub fn sweep_orphans_paged(
        &self,
        grace: Duration,
        page: usize,
    ) -> Result<super::blobs::Swept, StoreError> {
        let (mut swept, mut cursor) = (super::blobs::Swept::default(), None);
        loop {
            let (listed, next) = self.blobs.list_page(cursor.as_deref(), page)?;
            let now = std::time::SystemTime::now();
            let keys: Vec<String> = listed.iter().map(|e| e.key.clone()).collect();
            let named: std::collections::HashSet<String> = if keys.is_empty() {
                Default::default()
            } else {
                self.with(move |c| async move {
                    let rows = c
                        .query(
                            "SELECT blob_key FROM artifacts WHERE blob_key = ANY($1)",
                            &[&keys],
                        )
                        .await
                        .map_err(db)?;
                    Ok(rows.iter().map(|r| r.get(0)).collect())
                })?
            };
            for key in super::blobs::orphans(&listed, &named, now, grace) {
                self.blobs.delete(&key)?;
                swept.removed += 1;
            }
            swept.listed += listed.len();
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(swept),
            }
        }
    }

    /// Removes this host's directories of sessions deleted on another host (`sessions/<id>`,
    /// the primary workspace with its files): a delete removes the directory of the host it runs
    /// on only, and every other host that served the session kept its files, for good. A
    /// directory changed within `grace` stays (a create makes it before its row), and so does
    /// that of a session this host holds. Returns how many went.
    pub fn sweep_session_dirs(&self, grace: Duration) -> Result<usize, StoreError> {
        let sessions = self.data_dir.join("sessions");
        let entries = match std::fs::read_dir(&sessions) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io("list", &sessions, e)),
        };
        let now = std::time::SystemTime::now();
        let old: Vec<String> = entries
            .flatten()
            .filter_map(|entry| {
                let id = entry.file_name().into_string().ok()?;
                // The entry's own type and time (a link is not followed).
                let kind = entry.metadata().ok()?;
                let age = now.duration_since(kind.modified().ok()?).ok()?;
                (kind.is_dir()
                    && age >= grace
                    && check_id(&id).is_ok()
                    && self.held_epoch(&id).is_none())
                .then_some(id)
            })
            .collect();
        if old.is_empty() {
            return Ok(0);
        }
        let ids = old.clone();
        let existing: std::collections::HashSet<String> = self.with(move |c| async move {
            let rows = c
                .query("SELECT id FROM sessions WHERE id = ANY($1)", &[&ids])
                .await
                .map_err(db)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })?;
        let mut removed = 0;
        for id in old.iter().filter(|id| !existing.contains(*id)) {
            let dir = sessions.join(id);
            match crate::fsutil::remove_dir_by_rename(&dir) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(
                    "the directory of deleted session {id} stays until the next sweep: {e}"
                ),
            }
        }
        Ok(removed)
    }

    /// Removes the content of `keys`, `session`'s, whose rows are gone. A failure is logged, not
    /// returned: nothing names the content any more, and the orphan sweep takes it later. An
    /// upload's key of the layout before the session was in it may be another session's too,
    /// and is left to the sweep, which takes what no row names ([`owned_key`]).
    fn drop_content(&self, session: &str, keys: &[String]) {
        for key in keys.iter().filter(|key| owned_key(session, key)) {
            if let Err(e) = self.blobs.delete(key) {
                tracing::warn!("artifact content {key} stays until the orphan sweep: {e}");
            }
        }
    }

    /// Runs `f` with the connection of the lease renewal, on the driver thread: never behind
    /// the users' work, which takes the pool's connections first come first served (a few slow
    /// queries of one user delayed a renewal past the lease time, and every session of the
    /// host went to another host).
    fn with_renewal<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(pool::Conn) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.on(&self.renewal, f)
    }

    /// Runs `f` with a pooled connection on the driver thread.
    fn with<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(pool::Conn) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.on(&self.pool, f)
    }

    /// Runs `f` with a connection of `pool`, on the driver thread.
    fn on<T, F, Fut>(&self, pool: &Arc<Pool>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(pool::Conn) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let pool = pool.clone();
        self.driver.run(async move { pool.with_conn(f).await })
    }

    fn session_dir(&self, id: &str) -> PathBuf {
        self.data_dir.join("sessions").join(id)
    }
}

/// Applies the migrations of `known` that the database lacks, all in one transaction under an
/// advisory lock (two servers starting at once apply them once), recording each in
/// `monad_schema`. A database whose schema is newer than the last of `known` is refused.
pub async fn migrate(
    client: &mut tokio_postgres::Client,
    known: &[(i32, &str, &str)],
) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(db)?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(7306328450571840);
         CREATE TABLE IF NOT EXISTS monad_schema (
             version INTEGER PRIMARY KEY,
             name TEXT NOT NULL,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         );",
    )
    .await
    .map_err(db)?;
    let current: i32 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM monad_schema", &[])
        .await
        .map_err(db)?
        .get(0);
    let newest = known.last().map_or(0, |(v, _, _)| *v);
    if current > newest {
        return Err(StoreError::Invalid(format!(
            "the database schema is at version {current}, newer than this monad-server knows \
             (version {newest}): a newer monad-server migrated it; run that version (or newer)"
        )));
    }
    for (version, name, sql) in known.iter().filter(|(v, _, _)| *v > current) {
        tx.batch_execute(sql).await.map_err(|e| {
            StoreError::Database(format!("migration {version} ({name}): {}", describe(&e)))
        })?;
        tx.execute(
            "INSERT INTO monad_schema (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(db)?;
    }
    tx.commit().await.map_err(db)
}

/// Tokens, hashed (the `tokens` table), for [`crate::auth::TokenStore`] when the store is
/// PostgreSQL.
impl PgStore {
    /// Stores a token record (its hash, never the token).
    pub fn insert_token(&self, record: &crate::auth::TokenRecord) -> Result<(), StoreError> {
        let r = record.clone();
        self.with(move |c| async move {
            c.execute(
                "INSERT INTO tokens (id, user_name, hash, created_at) VALUES ($1, $2, $3, $4)",
                &[&r.id, &r.user, &r.hash, &r.created_at],
            )
            .await
            .map_err(db)?;
            Ok(())
        })
    }

    /// Every token record, oldest first.
    pub fn token_records(&self) -> Result<Vec<crate::auth::TokenRecord>, StoreError> {
        self.with(|c| async move {
            let rows = c
                .query(
                    "SELECT id, user_name, hash, created_at FROM tokens ORDER BY created_at, id",
                    &[],
                )
                .await
                .map_err(db)?;
            Ok(rows
                .iter()
                .map(|r| crate::auth::TokenRecord {
                    id: r.get(0),
                    user: r.get(1),
                    hash: r.get(2),
                    created_at: r.get(3),
                })
                .collect())
        })
    }

    /// Removes the token with this id; false when there is none.
    pub fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.with(move |c| async move {
            let n = c
                .execute("DELETE FROM tokens WHERE id = $1", &[&id])
                .await
                .map_err(db)?;
            Ok(n > 0)
        })
    }

    /// The user of the token whose SHA-256 is `hash`.
    pub fn token_user(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let hash = hash.to_owned();
        self.with(move |c| async move {
            let row = c
                .query_opt("SELECT user_name FROM tokens WHERE hash = $1", &[&hash])
                .await
                .map_err(db)?;
            Ok(row.map(|r| r.get(0)))
        })
    }
}

fn role_word(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::System => "system",
    }
}

/// A message's role; a word that is none (a row written by hand) is `None`, never taken for
/// the user's.
fn role_of(word: &str) -> Option<Role> {
    match word {
        "user" => Some(Role::User),
        "assistant" => Some(Role::Assistant),
        "system" => Some(Role::System),
        _ => None,
    }
}

/// A session row's metadata; a row no server writes (an empty owner, which no user has) is
/// corrupt: [`StoreError::Invalid`], so that it is refused to everyone and never re-created.
fn meta_of(row: &Row) -> Result<SessionMeta, StoreError> {
    // Unreadable (a later version's), it is as none: the focus comes back as its folder attaches.
    let kept: Option<String> = row.get("kept");
    let kept = kept
        .and_then(|text| serde_json::from_str::<Kept>(&text).ok())
        .unwrap_or_default();
    let meta = SessionMeta {
        id: row.get("id"),
        name: row.get("name"),
        owner: row.get("owner"),
        created_at: row.get("created_at"),
        last_active: row.get("last_active"),
        provider: row.get("provider"),
        model: row.get("model"),
        focus: kept.focus,
        folders: kept.folders,
    };
    if meta.owner.trim().is_empty() {
        return Err(StoreError::Invalid(format!(
            "session {}: its row in PostgreSQL names no owner (corrupt)",
            meta.id
        )));
    }
    Ok(meta)
}

/// The metadata of the rows that can be read; the others are skipped with a warning.
fn readable_metas(rows: &[Row]) -> Vec<SessionMeta> {
    rows.iter()
        .filter_map(|r| {
            meta_of(r)
                .map_err(|e| tracing::warn!("skipping a session: {e}"))
                .ok()
        })
        .collect()
}

/// An artifact row's metadata, checked against the row: a record that does not parse, or one
/// that names another session, another id or content under another key than its own, is
/// corrupt (never served: the content it points at may be another session's).
fn artifact_of(session: &str, id: &str, json: &str, key: &str) -> Result<ArtifactMeta, StoreError> {
    let meta: ArtifactMeta = serde_json::from_str(json).map_err(|e| {
        StoreError::Invalid(format!(
            "artifact {id} of session {session}: its record is not readable: {e}"
        ))
    })?;
    let its_own = blob_key(&meta) == key || old_blob_key(&meta).is_some_and(|old| old == key);
    if meta.session != session || meta.id != id || !its_own {
        return Err(StoreError::Invalid(format!(
            "artifact {id} of session {session}: its record does not match its row (corrupt); \
             it is not served"
        )));
    }
    Ok(meta)
}

fn record_of(row: &Row) -> WorkspaceRecord {
    WorkspaceRecord {
        id: row.get("id"),
        user: row.get("user_name"),
        device_id: row.get("device_id"),
        path: row.get("path"),
        uri: row.get("uri"),
        created_at: row.get("created_at"),
        last_active: row.get("last_active"),
    }
}

const SESSION_COLUMNS: &str = "id, name, owner, created_at, last_active, provider, model, kept";
const RECORD_COLUMNS: &str = "id, user_name, device_id, path, uri, created_at, last_active";

/// Whether a session exists (for appends, which must not make a conversation of nothing).
async fn session_exists(c: &impl GenericClient, id: &str) -> Result<(), StoreError> {
    let found = c
        .query_opt("SELECT 1 FROM sessions WHERE id = $1", &[&id])
        .await
        .map_err(db)?;
    match found {
        Some(_) => Ok(()),
        None => Err(StoreError::NotFound(format!("session {id}"))),
    }
}

/// `NotFound` when a statement on session `id`'s row changed none (`n` rows).
fn session_changed(n: u64, id: &str) -> Result<(), StoreError> {
    if n == 0 {
        return Err(StoreError::NotFound(format!("session {id}")));
    }
    Ok(())
}

impl SessionStore for PgStore {
    fn create(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        check_id(&meta.id)?;
        let dir = self.session_dir(&meta.id);
        let exists = || StoreError::Invalid(format!("session {} exists", meta.id));
        // Creates of one id on this host one at a time: one that found no row must not clear
        // the directory another has just made for its session (the directories are each
        // host's own).
        static CREATING: crate::quota::UserLocks<std::sync::Mutex<()>> =
            crate::quota::UserLocks::new();
        let creating = CREATING.of(&meta.id);
        let _one = creating.lock().unwrap_or_else(|p| p.into_inner());
        if self.load(&meta.id)?.is_some() {
            return Err(exists());
        }
        // No session has this id: a directory of it here is a deleted one's, which another host
        // deleted (a delete removes the directory of the host it runs on only). Its files are
        // not the new session's, whoever owns it (seed 001's `default` is made again by the
        // first user to come).
        if dir.exists() {
            crate::fsutil::remove_dir_by_rename(&dir)
                .map_err(|e| StoreError::io("remove a deleted session's directory", &dir, e))?;
        }
        create_workspace_root(&dir.join("workspace"))
            .map_err(|e| StoreError::io("create", &dir, e))?;
        let m = meta.clone();
        let created = self.with(move |c| async move {
            let kept = kept_of(&m);
            c.execute(
                "INSERT INTO sessions (id, name, owner, created_at, last_active, provider, model,
                     history_created_at, history_provider, history_model, kept)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $4, $6, $7, $8)
                 ON CONFLICT (id) DO NOTHING",
                &session_row(&m, &kept),
            )
            .await
            .map_err(db)
        })?;
        if created == 0 {
            return Err(exists());
        }
        Ok(())
    }

    fn load(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        self.with(move |c| async move {
            let row = c
                .query_opt(
                    &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(db)?;
            row.as_ref().map(meta_of).transpose()
        })
    }

    /// Replaces the record of a session that exists (a deleted one is not made again by a copy
    /// a host still had loaded). A host that does not hold the session's lease, while a host
    /// took it, only moves the last activity forward: its copy was read before the holder's
    /// later changes (replacing the whole record lost the focus folder the holder had kept
    /// since), and what else it could change runs where the session is served (the built-in
    /// agent's model) or writes its own column (a history's model, `replace`); a session's
    /// name is given as it is made, before any host takes it.
    fn save(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        check_id(&meta.id)?;
        let m = meta.clone();
        let fencing = self.fencing(&meta.id, lease::Write::Record);
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            let kept = kept_of(&m);
            let changed = if fencing.check_whole_record(&tx, &m.id).await? {
                tx.execute(
                    "UPDATE sessions SET name = $2, owner = $3, created_at = $4, last_active = $5,
                         provider = $6, model = $7, kept = $8
                     WHERE id = $1",
                    &session_row(&m, &kept),
                )
                .await
            } else {
                // RFC 3339 times in UTC, as the server writes them, compare as text.
                tx.execute(
                    "UPDATE sessions SET last_active = GREATEST(last_active, $2) WHERE id = $1",
                    &[&m.id, &m.last_active],
                )
                .await
            }
            .map_err(db)?;
            session_changed(changed, &m.id)?;
            tx.commit().await.map_err(db)
        })
    }

    fn all_sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        self.with(|c| async move {
            let rows = c
                .query(&format!("SELECT {SESSION_COLUMNS} FROM sessions"), &[])
                .await
                .map_err(db)?;
            Ok(readable_metas(&rows))
        })
    }

    fn owner_sessions(&self, owner: &str) -> Result<Vec<SessionMeta>, StoreError> {
        let owner = owner.to_owned();
        self.with(move |c| async move {
            let rows = c
                .query(
                    &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE owner = $1"),
                    &[&owner],
                )
                .await
                .map_err(db)?;
            Ok(readable_metas(&rows))
        })
    }

    fn count_sessions(&self, owner: &str) -> Result<usize, StoreError> {
        let owner = owner.to_owned();
        self.with(move |c| async move {
            let n: i64 = c
                .query_one("SELECT COUNT(*) FROM sessions WHERE owner = $1", &[&owner])
                .await
                .map_err(db)?
                .get(0);
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }

    fn delete(&self, id: &str) -> Result<(), StoreError> {
        check_id(id)?;
        let key = id.to_owned();
        let fencing = self.fencing(id, lease::Write::Delete);
        // The rows first (with the artifact index and the lease): once they are gone, nothing
        // names the content, which goes next.
        let blob_keys = self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &key).await?;
            let keys: Vec<String> = tx
                .query(
                    "SELECT blob_key FROM artifacts WHERE session_id = $1",
                    &[&key],
                )
                .await
                .map_err(db)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let n = tx
                .execute("DELETE FROM sessions WHERE id = $1", &[&key])
                .await
                .map_err(db)?;
            tx.execute("DELETE FROM leases WHERE session_id = $1", &[&key])
                .await
                .map_err(db)?;
            tx.commit().await.map_err(db)?;
            Ok((n, keys))
        })?;
        let (n, keys) = blob_keys;
        self.forget_lease(id);
        self.drop_content(id, &keys);
        let dir = self.session_dir(id);
        match crate::fsutil::remove_dir_by_rename(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io("delete", &dir, e)),
        }
        session_changed(n, id)
    }

    fn history(&self, id: &str) -> Result<History, StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        self.with(move |mut c| async move {
            // One snapshot: a replace between the two reads is seen whole or not at all.
            let tx = c
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(db)?;
            let head = tx
                .query_opt(
                    "SELECT history_created_at, history_provider, history_model
                     FROM sessions WHERE id = $1",
                    &[&id],
                )
                .await
                .map_err(db)?;
            let Some(head) = head else {
                return Ok(history::empty(now_rfc3339(), None, None));
            };
            let messages = tx
                .query(
                    "SELECT role, text, seq FROM messages WHERE session_id = $1 ORDER BY seq",
                    &[&id],
                )
                .await
                .map_err(db)?
                .iter()
                .map(|r| {
                    let word: &str = r.get(0);
                    match role_of(word) {
                        Some(role) => Ok(HistoryMessage {
                            role,
                            text: r.get(1),
                        }),
                        None => Err(StoreError::Invalid(format!(
                            "session {id}: message {} has the role `{}`, which is none of \
                             user, assistant, system (corrupt); the conversation is not shown",
                            r.get::<_, i64>(2),
                            monad_protocol::text::printable(word)
                        ))),
                    }
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            tx.commit().await.map_err(db)?;
            Ok(History {
                created_at: head.get(0),
                provider: head.get(1),
                model: head.get(2),
                messages,
            })
        })
    }

    fn append(&self, id: &str, message: &HistoryMessage) -> Result<(), StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        let (role, text) = (role_word(message.role), message.text.clone());
        let fencing = self.fencing(&id, lease::Write::Record);
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &id).await?;
            // The session's row locked first: two appends to one conversation measure and
            // write it one after the other.
            let locked = tx
                .query_opt("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&id])
                .await
                .map_err(db)?;
            if locked.is_none() {
                return Err(StoreError::NotFound(format!("session {id}")));
            }
            let held: i64 = tx
                .query_one(
                    "SELECT COALESCE(SUM(octet_length(text)), 0)::BIGINT
                     FROM messages WHERE session_id = $1",
                    &[&id],
                )
                .await
                .map_err(db)?
                .get(0);
            let after = u64::try_from(held)
                .unwrap_or(0)
                .saturating_add(text.len() as u64);
            history_fits(&id, after)?;
            let n = tx
                .execute(
                    "INSERT INTO messages (session_id, role, text)
                     SELECT id, $2, $3 FROM sessions WHERE id = $1",
                    &[&id, &role, &text],
                )
                .await
                .map_err(db)?;
            session_changed(n, &id)?;
            tx.commit().await.map_err(db)
        })
    }

    fn replace(&self, id: &str, history: &History) -> Result<(), StoreError> {
        check_id(id)?;
        history_fits(id, history_bytes(&history.messages))?;
        let id = id.to_owned();
        let h = history.clone();
        let fencing = self.fencing(&id, lease::Write::Record);
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &id).await?;
            let n = tx
                .execute(
                    "UPDATE sessions SET history_created_at = $2, history_provider = $3,
                         history_model = $4 WHERE id = $1",
                    &[&id, &h.created_at, &h.provider, &h.model],
                )
                .await
                .map_err(db)?;
            session_changed(n, &id)?;
            tx.execute("DELETE FROM messages WHERE session_id = $1", &[&id])
                .await
                .map_err(db)?;
            let roles: Vec<&str> = h.messages.iter().map(|m| role_word(m.role)).collect();
            let texts: Vec<&str> = h.messages.iter().map(|m| m.text.as_str()).collect();
            tx.execute(
                "INSERT INTO messages (session_id, role, text)
                 SELECT $1, r, t FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS m(r, t, n)
                 ORDER BY n",
                &[&id, &roles, &texts],
            )
            .await
            .map_err(db)?;
            tx.commit().await.map_err(db)
        })
    }

    fn set_history_model(
        &self,
        id: &str,
        provider: Option<&str>,
        model: Option<&str>,
    ) -> Result<(), StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        let (provider, model) = (provider.map(str::to_owned), model.map(str::to_owned));
        let fencing = self.fencing(&id, lease::Write::Record);
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &id).await?;
            // The messages are rows of their own: only the session's row changes.
            let n = tx
                .execute(
                    "UPDATE sessions SET history_provider = $2, history_model = $3 WHERE id = $1",
                    &[&id, &provider, &model],
                )
                .await
                .map_err(db)?;
            session_changed(n, &id)?;
            tx.commit().await.map_err(db)
        })
    }

    fn audit(&self, id: &str, records: &[AuditRecord]) -> Result<(), StoreError> {
        check_id(id)?;
        if records.is_empty() {
            return Ok(());
        }
        let id = id.to_owned();
        let lines: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).expect("records serialize"))
            .collect();
        let fencing = self.fencing(&id, lease::Write::Record);
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &id).await?;
            session_exists(&tx, &id).await?;
            // One session's appends one at a time, to their commits: a bystander host records
            // too (a network report that reached it), and a sequence number taken before
            // another's but committed after it was passed for good by a reader's cursor
            // (`audit_after`).
            tx.execute(LOCK_AUDIT, &[&id]).await.map_err(db)?;
            tx.execute(
                "INSERT INTO audit (session_id, record)
                 SELECT $1, r FROM unnest($2::text[]) WITH ORDINALITY AS a(r, n) ORDER BY n",
                &[&id, &lines],
            )
            .await
            .map_err(db)?;
            tx.commit().await.map_err(db)
        })
    }

    fn audit_log(&self, id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        Ok(self.audit_page(id, 0, i64::MAX as usize)?.0)
    }

    fn audit_count(&self, id: &str) -> Result<usize, StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        self.with(move |c| async move {
            let n: i64 = c
                .query_one("SELECT COUNT(*) FROM audit WHERE session_id = $1", &[&id])
                .await
                .map_err(db)?
                .get(0);
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }

    fn audit_page(
        &self,
        id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, usize), StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |mut c| async move {
            let (total, rows) = counted_page(
                &mut c,
                "SELECT COUNT(*) FROM audit WHERE session_id = $1",
                "SELECT record FROM audit WHERE session_id = $1 ORDER BY seq OFFSET $2 LIMIT $3",
                &id,
                (offset, limit),
            )
            .await?;
            let records = readable_audit(&id, &rows).collect();
            Ok((records, usize::try_from(total).unwrap_or(0)))
        })
    }

    /// On the rows' sequence numbers (`seq`), through the `(session_id, seq)` index: a page far
    /// into a long log costs what the first does, where `OFFSET` counted every row before it
    /// (and a count of the whole log came with each page), so reading a log through took time
    /// in the square of its length. One session's appends go one at a time to their commits
    /// ([`LOCK_AUDIT`]; the host that holds its lease and a bystander recording alike), so
    /// their sequence numbers are committed in order and a cursor never passes one still to
    /// come.
    fn audit_after(
        &self,
        id: &str,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, u64), StoreError> {
        check_id(id)?;
        let id = id.to_owned();
        let after = i64::try_from(cursor).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |c| async move {
            let rows = c
                .query(
                    "SELECT record, seq FROM audit WHERE session_id = $1 AND seq > $2 \
                     ORDER BY seq LIMIT $3",
                    &[&id, &after, &limit],
                )
                .await
                .map_err(db)?;
            let last = rows.last().map_or(after, |r| r.get::<_, i64>(1));
            let records = readable_audit(&id, &rows).collect();
            Ok((records, u64::try_from(last).unwrap_or(cursor).max(cursor)))
        })
    }

    fn config_text(&self, id: &str) -> Result<Option<(String, String)>, StoreError> {
        check_id(id)?;
        let key = id.to_owned();
        let text: Option<String> = self.with(move |c| async move {
            let row = c
                .query_opt("SELECT config FROM sessions WHERE id = $1", &[&key])
                .await
                .map_err(db)?;
            Ok(row.and_then(|r| r.get(0)))
        })?;
        Ok(text.map(|t| (format!("the config of session {id} (PostgreSQL)"), t)))
    }

    fn searches_itself(&self) -> bool {
        true
    }

    fn search_sessions(&self, owner: &str, query: &str) -> Result<Vec<String>, StoreError> {
        self.search(owner, query, None)
    }

    /// Only the page asked for (and one more, to say whether more follow) leaves the database,
    /// which stops reading conversations once it has them.
    fn search_page(
        &self,
        owner: &str,
        query: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let mut found = self.search(owner, query, Some((offset, limit.saturating_add(1))))?;
        let more = found.len() > limit;
        found.truncate(limit);
        Ok((found, more))
    }
}

impl PgStore {
    /// The ids of `owner`'s sessions whose conversation holds every word of `query`, latest
    /// first; from `offset`, at most `limit`, when `window` is `(offset, limit)`.
    fn search(
        &self,
        owner: &str,
        query: &str,
        window: Option<(usize, usize)>,
    ) -> Result<Vec<String>, StoreError> {
        // A row with no owner (corrupt) is nobody's.
        if owner.trim().is_empty() {
            return Ok(Vec::new());
        }
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let owner = owner.to_owned();
        let (offset, limit) = window.map_or((0, None), |(o, l)| (o, Some(l)));
        let as_row = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let (offset, limit) = (as_row(offset), limit.map(as_row));
        self.with(move |c| async move {
            let rows = c
                .query(
                    "SELECT s.id FROM sessions s
                     LEFT JOIN LATERAL (
                         SELECT lower(string_agg(text, E'\\n' ORDER BY seq)) AS t
                         FROM messages WHERE session_id = s.id
                     ) m ON true
                     WHERE s.owner = $1
                       AND COALESCE((SELECT bool_and(strpos(COALESCE(m.t, ''), w) > 0)
                                     FROM unnest($2::text[]) AS w), true)
                     ORDER BY s.last_active DESC, s.id
                     LIMIT $3 OFFSET $4",
                    &[&owner, &words, &limit, &offset],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }
}

impl WorkspaceStore for PgStore {
    fn resolve_record(
        &self,
        user: &str,
        device_id: &str,
        path: &str,
        uri: &str,
    ) -> Result<WorkspaceRecord, StoreError> {
        let (user, device, path, uri) = (
            user.to_owned(),
            device_id.to_owned(),
            path.to_owned(),
            uri.to_owned(),
        );
        let id = uuid::Uuid::new_v4().to_string();
        let now = now_rfc3339();
        self.with(move |c| async move {
            // One statement: of racing resolves of the same folder, one inserts and the others
            // update the row it made, so all get the same record.
            let row = c
                .query_one(
                    &format!(
                        "INSERT INTO workspaces ({RECORD_COLUMNS}, resolved)
                         VALUES ($1, $2, $3, $4, $5, $6, $6, true)
                         ON CONFLICT (user_name, device_id, path) WHERE resolved
                         DO UPDATE SET uri = EXCLUDED.uri
                         RETURNING {RECORD_COLUMNS}"
                    ),
                    &[&id, &user, &device, &path, &uri, &now],
                )
                .await
                .map_err(db)?;
            Ok(record_of(&row))
        })
    }

    fn record(&self, id: &str) -> Result<Option<WorkspaceRecord>, StoreError> {
        let id = id.to_owned();
        self.with(move |c| async move {
            let row = c
                .query_opt(
                    &format!("SELECT {RECORD_COLUMNS} FROM workspaces WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(db)?;
            Ok(row.as_ref().map(record_of))
        })
    }

    fn records(&self, user: Option<&str>) -> Result<Vec<WorkspaceRecord>, StoreError> {
        let user = user.map(str::to_owned);
        self.with(move |c| async move {
            let rows = c
                .query(
                    &format!(
                        "SELECT {RECORD_COLUMNS} FROM workspaces
                         WHERE $1::text IS NULL OR user_name = $1
                         ORDER BY last_active DESC, id"
                    ),
                    &[&user],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().map(record_of).collect())
        })
    }

    /// By the index of the records' sessions by session (one statement; paging through every
    /// record of the user took one or more each).
    fn session_records(&self, user: &str, session: &str) -> Result<Vec<String>, StoreError> {
        let (user, session) = (user.to_owned(), session.to_owned());
        self.with(move |c| async move {
            let rows = c
                .query(
                    "SELECT w.id FROM workspace_sessions s JOIN workspaces w ON w.id = s.workspace_id
                     WHERE s.session_id = $1 AND w.user_name = $2
                     ORDER BY w.last_active DESC, w.id",
                    &[&session, &user],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn touch_record(&self, id: &str, session: &str, calls: u64) -> Result<(), StoreError> {
        let (id, session) = (id.to_owned(), session.to_owned());
        let calls = i64::try_from(calls).unwrap_or(i64::MAX);
        let now = now_rfc3339();
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            let n = tx
                .execute(
                    "UPDATE workspaces SET last_active = $2 WHERE id = $1",
                    &[&id, &now],
                )
                .await
                .map_err(db)?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("workspace record {id}")));
            }
            tx.execute(
                "INSERT INTO workspace_sessions (workspace_id, session_id, first_at, last_active,
                     calls)
                 VALUES ($1, $2, $3, $3, $4)
                 ON CONFLICT (workspace_id, session_id) DO UPDATE
                 SET last_active = $3, calls = workspace_sessions.calls + $4",
                &[&id, &session, &now, &calls],
            )
            .await
            .map_err(db)?;
            tx.commit().await.map_err(db)
        })
    }

    fn record_sessions(
        &self,
        id: &str,
        limit: usize,
        next: Option<&str>,
    ) -> Result<Page<WorkspaceSession>, StoreError> {
        if !(1..=100).contains(&limit) {
            return Err(StoreError::Invalid(format!(
                "limit {limit} is out of range: 1 to 100"
            )));
        }
        let after = next.map(decode_cursor).transpose()?;
        let id = id.to_owned();
        self.with(move |c| async move {
            if c.query_opt("SELECT 1 FROM workspaces WHERE id = $1", &[&id])
                .await
                .map_err(db)?
                .is_none()
            {
                return Err(StoreError::NotFound(format!("workspace record {id}")));
            }
            let (after_active, after_session) = after.unzip();
            // One more than a page: whether there is a next one.
            let rows = c
                .query(
                    "SELECT session_id, first_at, last_active, calls FROM workspace_sessions
                     WHERE workspace_id = $1
                       AND ($2::text IS NULL
                            OR last_active < $2 OR (last_active = $2 AND session_id > $3))
                     ORDER BY last_active DESC, session_id
                     LIMIT $4",
                    &[&id, &after_active, &after_session, &(limit as i64 + 1)],
                )
                .await
                .map_err(db)?;
            let mut items: Vec<WorkspaceSession> = rows
                .iter()
                .map(|r| WorkspaceSession {
                    session: r.get(0),
                    first_at: r.get(1),
                    last_active: r.get(2),
                    calls: u64::try_from(r.get::<_, i64>(3)).unwrap_or(0),
                })
                .collect();
            let more = items.len() > limit;
            items.truncate(limit);
            let next = more
                .then(|| {
                    items
                        .last()
                        .map(|s| encode_cursor(&s.last_active, &s.session))
                })
                .flatten();
            Ok(Page { items, next })
        })
    }

    fn forget_session(&self, session: &str) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.with(move |c| async move {
            c.execute(
                "DELETE FROM workspace_sessions WHERE session_id = $1",
                &[&session],
            )
            .await
            .map_err(db)?;
            Ok(())
        })
    }

    fn add_record(&self, record: &WorkspaceRecord) -> Result<(), StoreError> {
        check_id(&record.id)?;
        let r = record.clone();
        let n = self.with(move |c| async move {
            c.execute(
                &format!(
                    "INSERT INTO workspaces ({RECORD_COLUMNS}, resolved)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, false)
                     ON CONFLICT (id) DO NOTHING"
                ),
                &[
                    &r.id,
                    &r.user,
                    &r.device_id,
                    &r.path,
                    &r.uri,
                    &r.created_at,
                    &r.last_active,
                ],
            )
            .await
            .map_err(db)
        })?;
        if n == 0 {
            return Err(StoreError::Invalid(format!(
                "workspace record {} exists",
                record.id
            )));
        }
        Ok(())
    }

    fn delete_record(&self, id: &str) -> Result<(), StoreError> {
        check_id(id)?;
        let key = id.to_owned();
        let n = self.with(move |c| async move {
            c.execute("DELETE FROM workspaces WHERE id = $1", &[&key])
                .await
                .map_err(db)
        })?;
        if n == 0 {
            return Err(StoreError::NotFound(format!("workspace record {id}")));
        }
        Ok(())
    }
}

/// A binding's use is written again (on a lookup) once it is this old, as in [`FsStore`].
const BINDING_TOUCH_MS: i64 = 24 * 60 * 60 * 1000;

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Serializes the audit appends of one session, to their commits (an advisory lock on a hash
/// of its id, held by the transaction), so that its rows' sequence numbers are committed in
/// order ([`PgStore::audit_after`]).
const LOCK_AUDIT: &str = "SELECT pg_advisory_xact_lock(hashtextextended('audit:' || $1, 0))";

/// Serializes the binding changes of one user (an advisory lock on a hash of the name, held
/// until the transaction ends).
const LOCK_USER: &str = "SELECT pg_advisory_xact_lock(hashtextextended('bindings:' || $1, 0))";

impl BindingStore for PgStore {
    fn bound_session(&self, user: &str, device_id: &str) -> Result<Option<String>, StoreError> {
        let (user, device) = (user.to_owned(), device_id.to_owned());
        let now = unix_ms();
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            let row = tx
                .query_opt(
                    "SELECT session_id, used FROM bindings WHERE user_name = $1 AND device_id = $2",
                    &[&user, &device],
                )
                .await
                .map_err(db)?;
            let Some(row) = row else {
                return Ok(None);
            };
            let (session, used): (String, i64) = (row.get(0), row.get(1));
            if now.saturating_sub(used) >= BINDING_TOUCH_MS {
                tx.execute(LOCK_USER, &[&user]).await.map_err(db)?;
                tx.execute(
                    "UPDATE bindings SET used = GREATEST($3,
                         (SELECT COALESCE(MAX(used), 0) + 1 FROM bindings WHERE user_name = $1))
                     WHERE user_name = $1 AND device_id = $2",
                    &[&user, &device, &now],
                )
                .await
                .map_err(db)?;
            }
            tx.commit().await.map_err(db)?;
            Ok(Some(session))
        })
    }

    fn bind(&self, user: &str, device_id: &str, session: &str) -> Result<(), StoreError> {
        let (user, device, session) = (user.to_owned(), device_id.to_owned(), session.to_owned());
        let max = i64::try_from(self.max_devices_per_user.max(1)).unwrap_or(i64::MAX);
        let now = unix_ms();
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            tx.execute(LOCK_USER, &[&user]).await.map_err(db)?;
            let current = tx
                .query_opt(
                    "SELECT session_id, used FROM bindings WHERE user_name = $1 AND device_id = $2",
                    &[&user, &device],
                )
                .await
                .map_err(db)?;
            if let Some(row) = current
                && row.get::<_, String>(0) == session
                && now.saturating_sub(row.get::<_, i64>(1)) < BINDING_TOUCH_MS
            {
                return Ok(());
            }
            tx.execute(
                "INSERT INTO bindings (user_name, device_id, session_id, used)
                 VALUES ($1, $2, $3, GREATEST($4,
                     (SELECT COALESCE(MAX(used), 0) + 1 FROM bindings WHERE user_name = $1)))
                 ON CONFLICT (user_name, device_id) DO UPDATE
                 SET session_id = EXCLUDED.session_id, used = EXCLUDED.used",
                &[&user, &device, &session, &now],
            )
            .await
            .map_err(db)?;
            // Past the bound, the least recently used devices go.
            tx.execute(
                "DELETE FROM bindings WHERE user_name = $1 AND device_id IN (
                     SELECT device_id FROM bindings WHERE user_name = $1
                     ORDER BY used DESC OFFSET $2)",
                &[&user, &max],
            )
            .await
            .map_err(db)?;
            tx.commit().await.map_err(db)
        })
    }

    fn default_session(&self, user: &str) -> Result<Option<String>, StoreError> {
        let user = user.to_owned();
        self.with(move |c| async move {
            let row = c
                .query_opt(
                    "SELECT session_id FROM defaults WHERE user_name = $1",
                    &[&user],
                )
                .await
                .map_err(db)?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn set_default_session(&self, user: &str, session: &str) -> Result<(), StoreError> {
        let (user, session) = (user.to_owned(), session.to_owned());
        self.with(move |c| async move {
            c.execute(
                "INSERT INTO defaults (user_name, session_id) VALUES ($1, $2)
                 ON CONFLICT (user_name) DO UPDATE SET session_id = EXCLUDED.session_id",
                &[&user, &session],
            )
            .await
            .map_err(db)?;
            Ok(())
        })
    }

    fn unbind_session(&self, session: &str) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.with(move |mut c| async move {
            // A transaction dropped midway (the operation's time-out) is rolled back.
            let tx = c.transaction().await.map_err(db)?;
            tx.execute("DELETE FROM bindings WHERE session_id = $1", &[&session])
                .await
                .map_err(db)?;
            tx.execute("DELETE FROM defaults WHERE session_id = $1", &[&session])
                .await
                .map_err(db)?;
            tx.commit().await.map_err(db)
        })
    }

    fn devices_bound_to(&self, session: &str) -> Result<usize, StoreError> {
        let session = session.to_owned();
        self.with(move |c| async move {
            let n: i64 = c
                .query_one(
                    "SELECT COUNT(*) FROM bindings WHERE session_id = $1",
                    &[&session],
                )
                .await
                .map_err(db)?
                .get(0);
            Ok(usize::try_from(n).unwrap_or(0))
        })
    }
}

fn folder_of(row: &Row) -> Result<crate::roots::FolderSessions, StoreError> {
    let sessions: String = row.get("sessions");
    let sessions: BTreeMap<String, u64> = serde_json::from_str(&sessions)
        .map_err(|e| StoreError::Invalid(format!("a folder registry row is not readable: {e}")))?;
    Ok(crate::roots::FolderSessions {
        user: row.get("user_name"),
        device: row.get("device_id"),
        folder: row.get("folder"),
        active: row.get("active"),
        sessions,
    })
}

impl FolderStore for PgStore {
    fn folder_sessions(
        &self,
        user: &str,
        device: &str,
    ) -> Result<Vec<crate::roots::FolderSessions>, StoreError> {
        let (user, device) = (user.to_owned(), device.to_owned());
        self.with(move |c| async move {
            let rows = c
                .query(
                    "SELECT user_name, device_id, folder, active, sessions FROM folder_sessions
                     WHERE user_name = $1 AND device_id = $2 ORDER BY folder",
                    &[&user, &device],
                )
                .await
                .map_err(db)?;
            rows.iter().map(folder_of).collect()
        })
    }

    fn save_folder_sessions(&self, entry: &crate::roots::FolderSessions) -> Result<(), StoreError> {
        let e = entry.clone();
        let sessions = serde_json::to_string(&entry.sessions).expect("a map serializes");
        self.with(move |c| async move {
            if e.is_empty() {
                c.execute(
                    "DELETE FROM folder_sessions
                     WHERE user_name = $1 AND device_id = $2 AND folder = $3",
                    &[&e.user, &e.device, &e.folder],
                )
                .await
                .map_err(db)?;
            } else {
                c.execute(
                    "INSERT INTO folder_sessions (user_name, device_id, folder, active, sessions)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (user_name, device_id, folder) DO UPDATE
                     SET active = EXCLUDED.active, sessions = EXCLUDED.sessions",
                    &[&e.user, &e.device, &e.folder, &e.active, &sessions],
                )
                .await
                .map_err(db)?;
                // The user's folders are bounded: past it, the ones used longest ago go.
                let keep = crate::roots::MAX_FOLDERS_PER_USER as i64 - 1;
                c.execute(
                    "DELETE FROM folder_sessions WHERE (user_name, device_id, folder) IN (
                         SELECT user_name, device_id, folder FROM folder_sessions
                         WHERE user_name = $1 AND NOT (device_id = $2 AND folder = $3)
                         ORDER BY (SELECT coalesce(max(value::bigint), 0)
                                   FROM json_each_text(sessions::json)) DESC
                         OFFSET $4)",
                    &[&e.user, &e.device, &e.folder, &keep],
                )
                .await
                .map_err(db)?;
            }
            Ok(())
        })
    }

    fn prune_folder_sessions(
        &self,
        now: u64,
        last_active: &std::collections::HashMap<String, u64>,
    ) -> Result<usize, StoreError> {
        let last_active = last_active.clone();
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            let rows = tx
                .query(
                    "SELECT user_name, device_id, folder, active, sessions FROM folder_sessions
                     FOR UPDATE",
                    &[],
                )
                .await
                .map_err(db)?;
            let mut changed = 0;
            for row in &rows {
                let Ok(mut entry) = folder_of(row) else {
                    continue;
                };
                let (entry_changed, pruned) = entry.prune_by_activity(now, &last_active);
                if !entry_changed {
                    continue;
                }
                changed += usize::from(pruned);
                if entry.is_empty() {
                    tx.execute(
                        "DELETE FROM folder_sessions
                         WHERE user_name = $1 AND device_id = $2 AND folder = $3",
                        &[&entry.user, &entry.device, &entry.folder],
                    )
                    .await
                    .map_err(db)?;
                } else {
                    let sessions =
                        serde_json::to_string(&entry.sessions).expect("a map serializes");
                    tx.execute(
                        "UPDATE folder_sessions SET active = $4, sessions = $5
                         WHERE user_name = $1 AND device_id = $2 AND folder = $3",
                        &[
                            &entry.user,
                            &entry.device,
                            &entry.folder,
                            &entry.active,
                            &sessions,
                        ],
                    )
                    .await
                    .map_err(db)?;
                }
            }
            tx.commit().await.map_err(db)?;
            Ok(changed)
        })
    }
}

/// Where an artifact's content is: `{workspaceId}/{sessionId}.{artifactId}` for an upload to a
/// workspace (seed 004's `{workspaceId}/{artifactId}`, with the artifact's public id),
/// `{sessionId}/{artifactId}` otherwise. An artifact's id is its session's own (the history
/// snapshot's is always `session_history`), so the session is in every key.
pub fn blob_key(meta: &ArtifactMeta) -> String {
    match &meta.upload {
        Some(upload) => format!("{}/{}.{}", upload.workspace_id, meta.session, meta.id),
        None => format!("{}/{}", meta.session, meta.id),
    }
}

/// Whether `key` is one of `session`'s own keys ([`blob_key`]: `{session}/…` or
/// `{workspace}/{session}.…`), which no other session's row names.
fn owned_key(session: &str, key: &str) -> bool {
    key.split_once('/').is_some_and(|(scope, id)| {
        scope == session
            || id
                .strip_prefix(session)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The key an upload's content had before the session was in it (`{workspaceId}/{artifactId}`),
/// for the rows written then: still served, and dropped with them.
fn old_blob_key(meta: &ArtifactMeta) -> Option<String> {
    meta.upload
        .as_ref()
        .map(|upload| format!("{}/{}", upload.workspace_id, meta.id))
}

impl ArtifactStore for PgStore {
    fn put_artifact(&self, meta: &ArtifactMeta, content: &[u8]) -> Result<(), StoreError> {
        check_id(&meta.session)?;
        check_id(&meta.id)?;
        if let Some(upload) = &meta.upload {
            check_id(&upload.workspace_id)?;
        }
        let key = blob_key(meta);
        // Fenced before the content is written too: an artifact with a fixed id (the history
        // snapshot) has a fixed key, and a stale owner must not overwrite the new owner's
        // content. The check is made again with the row, under the lease's lock.
        let fencing = self.fencing(&meta.session, lease::Write::Record);
        let (check, session) = (fencing.clone(), meta.session.clone());
        self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            check.check(&tx, &session).await?;
            tx.commit().await.map_err(db)
        })?;
        // The content first, durably; only then the row that names it. A crash between the two
        // leaves content no row names (swept later), never a row naming nothing.
        self.blobs.put(&key, content)?;
        let (session, id) = (meta.session.clone(), meta.id.clone());
        let json = serde_json::to_string(meta).expect("metadata serializes");
        let stored_key = key.clone();
        let replaced: Option<String> = self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &session).await?;
            session_exists(&tx, &session).await?;
            let old = tx
                .query_opt(
                    "SELECT blob_key FROM artifacts WHERE session_id = $1 AND id = $2 FOR UPDATE",
                    &[&session, &id],
                )
                .await
                .map_err(db)?
                .map(|r| r.get::<_, String>(0));
            // A replaced artifact (the history snapshot) keeps its place in the list.
            tx.execute(
                "INSERT INTO artifacts (session_id, id, meta, blob_key) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session_id, id) DO UPDATE
                 SET meta = EXCLUDED.meta, blob_key = EXCLUDED.blob_key",
                &[&session, &id, &json, &stored_key],
            )
            .await
            .map_err(db)?;
            tx.commit().await.map_err(db)?;
            Ok(old.filter(|k| *k != stored_key))
        })?;
        if let Some(old) = replaced {
            self.drop_content(&meta.session, &[old]);
        }
        Ok(())
    }

    fn artifacts(&self, session: &str) -> Result<Vec<ArtifactMeta>, StoreError> {
        check_id(session)?;
        let session = session.to_owned();
        self.with(move |c| async move {
            let rows = c
                .query(
                    "SELECT id, meta, blob_key FROM artifacts WHERE session_id = $1 ORDER BY seq",
                    &[&session],
                )
                .await
                .map_err(db)?;
            Ok(readable_artifacts(&session, &rows).collect())
        })
    }

    /// The ids named, by a query of those rows alone; all of them a page at a time.
    fn uploaded_bytes_in(&self, session: &str, ids: Option<&[String]>) -> Result<u64, StoreError> {
        check_id(session)?;
        let Some(ids) = ids else {
            return super::uploaded_bytes_by_pages(self, session, None);
        };
        let (session, ids) = (session.to_owned(), ids.to_vec());
        self.with(move |c| async move {
            let rows = c
                .query(
                    "SELECT id, meta, blob_key FROM artifacts
                     WHERE session_id = $1 AND id = ANY($2)",
                    &[&session, &ids],
                )
                .await
                .map_err(db)?;
            Ok(readable_artifacts(&session, &rows)
                .map(|m| m.charged_bytes())
                .fold(0, u64::saturating_add))
        })
    }

    fn artifact_page(
        &self,
        session: &str,
        offset: usize,
        limit: usize,
    ) -> Result<ArtifactPage, StoreError> {
        check_id(session)?;
        let session = session.to_owned();
        let start = offset;
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |mut c| async move {
            let (total, rows) = counted_page(
                &mut c,
                "SELECT COUNT(*) FROM artifacts WHERE session_id = $1",
                "SELECT id, meta, blob_key FROM artifacts WHERE session_id = $1
                 ORDER BY seq OFFSET $2 LIMIT $3",
                &session,
                (offset, limit),
            )
            .await?;
            let total = usize::try_from(total).unwrap_or(0);
            let artifacts = readable_artifacts(&session, &rows).collect();
            Ok(ArtifactPage {
                artifacts,
                end: start.min(total) + rows.len(),
                total,
            })
        })
    }

    fn call_artifacts(
        &self,
        session: &str,
        calls: &std::collections::HashSet<String>,
    ) -> Result<Vec<ArtifactMeta>, StoreError> {
        check_id(session)?;
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let session = session.to_owned();
        let wanted = calls.clone();
        // Each call's field as `put_artifact` writes the metadata (serde_json, compact): a
        // call id alone matched any row holding it anywhere, and a made-up one (`-`, `"`)
        // brought every row of the session, each up to 64 KiB of upload metadata.
        let calls: Vec<String> = calls
            .iter()
            .map(|c| format!("\"call_id\":{}", serde_json::Value::String(c.clone())))
            .collect();
        self.with(move |c| async move {
            // Only the rows whose metadata holds one of the calls' fields leave the database
            // (the metadata is JSON text, matched as text: a row that is not JSON must not fail
            // the query), then only those of the calls.
            let rows = c
                .query(
                    "SELECT id, meta, blob_key FROM artifacts WHERE session_id = $1
                     AND EXISTS (SELECT 1 FROM unnest($2::text[]) AS c WHERE strpos(meta, c) > 0)
                     ORDER BY seq",
                    &[&session, &calls],
                )
                .await
                .map_err(db)?;
            Ok(readable_artifacts(&session, &rows)
                .filter(|a| a.call_id.as_ref().is_some_and(|c| wanted.contains(c)))
                .collect())
        })
    }

    fn artifact(&self, session: &str, id: &str) -> Result<(ArtifactMeta, Vec<u8>), StoreError> {
        check_id(session)?;
        check_id(id).map_err(|_| StoreError::NotFound(format!("artifact {id}")))?;
        let (s, i) = (session.to_owned(), id.to_owned());
        let row: Option<(String, String)> = self.with(move |c| async move {
            let row = c
                .query_opt(
                    "SELECT meta, blob_key FROM artifacts WHERE session_id = $1 AND id = $2",
                    &[&s, &i],
                )
                .await
                .map_err(db)?;
            Ok(row.map(|r| (r.get(0), r.get(1))))
        })?;
        let Some((json, key)) = row else {
            return Err(StoreError::NotFound(format!(
                "artifact {id} in session {session}"
            )));
        };
        let meta = artifact_of(session, id, &json, &key)?;
        match self.blobs.get(&key)? {
            Some(content) => Ok((meta, content)),
            None => Err(StoreError::Database(format!(
                "artifact {id} of session {session} is indexed but its content ({key}) is \
                 missing from the blob store"
            ))),
        }
    }

    fn delete_artifacts(&self, session: &str, ids: &[String]) -> Result<(), StoreError> {
        check_id(session)?;
        let session_of_keys = session.to_owned();
        let session = session.to_owned();
        let ids = ids.to_vec();
        let fencing = self.fencing(&session, lease::Write::Record);
        // The rows first: an artifact no row names is gone even if its content stays.
        let keys: Vec<String> = self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            fencing.check(&tx, &session).await?;
            let rows = tx
                .query(
                    "DELETE FROM artifacts WHERE session_id = $1 AND id = ANY($2)
                     RETURNING blob_key",
                    &[&session, &ids],
                )
                .await
                .map_err(db)?;
            tx.commit().await.map_err(db)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })?;
        self.drop_content(&session_of_keys, &keys);
        Ok(())
    }
}

/// The default bounds of the pool.
impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 8,
            connect_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(60),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_url_takes_what_it_lacks_from_the_pg_variables_and_names_no_password() {
        let (config, name) = parse_url(
            "postgres://db.internal:6543/monad",
            vars(&[
                ("PGUSER", "monad"),
                ("PGPASSWORD", "s3cret"),
                ("PGPORT", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(config.get_user(), Some("monad"));
        assert_eq!(config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(config.get_ports(), &[6543]);
        assert_eq!(name, "db.internal:6543/monad");
        let (_, name) = parse_url("postgres://ana:pw@localhost/x", vars(&[])).unwrap();
        assert!(!name.contains("pw"), "{name}");
    }

    #[test]
    fn a_bad_url_or_one_without_a_user_is_a_clear_error() {
        for (url, says) in [
            ("mysql://x", "not a PostgreSQL connection string"),
            ("postgres://localhost/db", "names no user"),
            (
                "postgres://u@h:notaport/db",
                "not a PostgreSQL connection string",
            ),
        ] {
            let e = parse_url(url, vars(&[])).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        let e = parse_url("postgres:///db", vars(&[("PGUSER", "u"), ("PGPORT", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("PGPORT `x` is not a port number"), "{e}");
        let (config, name) = parse_url(
            "postgres:///db",
            vars(&[("PGUSER", "u"), ("PGHOST", "db"), ("PGPORT", "6000")]),
        )
        .unwrap();
        assert_eq!(config.get_ports(), &[6000]);
        assert_eq!(name, "db:6000/db");
    }

    #[test]
    fn blob_keys_are_the_workspace_then_the_session_then_the_artifact() {
        let mut meta = ArtifactMeta {
            id: "a1".into(),
            session: "s1".into(),
            kind: ArtifactKind::ToolOutput,
            workspace: None,
            tool: None,
            call_id: None,
            created_at: "t".into(),
            content_type: "application/json".into(),
            size: 0,
            truncated: false,
            original_size: 0,
            upload: None,
        };
        assert_eq!(blob_key(&meta), "s1/a1");
        meta.upload = Some(Box::new(Upload {
            workspace_id: "w1".into(),
            task_id: None,
            step_id: None,
            name: None,
            metadata: Default::default(),
        }));
        assert_eq!(blob_key(&meta), "w1/s1.a1");
        // Only a session's own keys are dropped with its rows: an upload's key of the layout
        // before (`w1/a1`) may name another session's content too.
        assert!(owned_key("s1", "s1/a1") && owned_key("s1", "w1/s1.a1"));
        assert!(!owned_key("s1", "w1/a1") && !owned_key("s1", "w1/s10.a1"));
        assert!(!owned_key("s1", "s10/a1"));
    }
}
