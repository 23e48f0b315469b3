//! Tokens: created by the operator, stored hashed in `tokens.toml` (or, when the store is
//! PostgreSQL, in its `tokens` table), each belonging to a user.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ServerError;
use crate::fsutil::{now_rfc3339, write_atomic};

/// One stored token. The token itself is never stored, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// Short public id, for `token list` and `token revoke`.
    pub id: String,
    /// The user the token authenticates as.
    pub user: String,
    /// SHA-256 of the token, hex.
    pub hash: String,
    /// When it was created, RFC 3339.
    pub created_at: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default, rename = "token")]
    tokens: Vec<TokenRecord>,
}

/// The token file. [`TokenStore::verify`] answers from memory (a map from hash to user) and
/// reads the file again only when it changed (its inode, size or modification time differ:
/// every write replaces it by a rename), so tokens created or revoked with
/// `monad-server token ...` take effect on a running server at the next connection or request,
/// and a request costs one `stat`, not a read and a parse.
///
/// With PostgreSQL ([`TokenStore::in_postgres`]) the records are rows of the `tokens` table and
/// `verify` is one indexed query on the hash, so a token created or revoked on any host takes
/// effect everywhere at the next connection or request.
#[derive(Debug, Clone)]
pub struct TokenStore {
    path: PathBuf,
    cache: std::sync::Arc<std::sync::Mutex<Option<Cached>>>,
    db: Option<std::sync::Arc<crate::store::PgStore>>,
}

/// The token file as last read: its stamp, and each token hash's user.
type Cached = (Stamp, std::collections::HashMap<String, String>);

/// What tells one version of the token file from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl Stamp {
    /// The file's stamp, or `None` when there is no file.
    fn of(path: &Path) -> Result<Option<Stamp>, ServerError> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(Stamp {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime: m.mtime(),
                mtime_nsec: m.mtime_nsec(),
                ctime: m.ctime(),
                ctime_nsec: m.ctime_nsec(),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ServerError::io("inspect", path, e)),
        }
    }
}

impl TokenStore {
    /// The store at `<data_dir>/tokens.toml`.
    pub fn new(data_dir: &Path) -> TokenStore {
        TokenStore {
            path: data_dir.join("tokens.toml"),
            cache: Default::default(),
            db: None,
        }
    }

    /// The tokens in the PostgreSQL store's `tokens` table (`tokens.toml` is not read).
    pub fn in_postgres(
        data_dir: &Path,
        store: std::sync::Arc<crate::store::PgStore>,
    ) -> TokenStore {
        TokenStore {
            db: Some(store),
            ..TokenStore::new(data_dir)
        }
    }

    /// The tokens where the server at `data_dir` keeps them: its `[store]` setting (the data
    /// dir's `config.toml`, `MONAD_STORE_URL`) names PostgreSQL or not. For the commands that
    /// run beside (or without) a server.
    pub fn open(data_dir: &Path) -> Result<TokenStore, ServerError> {
        let settings = crate::settings::store_settings(data_dir)?;
        match settings.url.as_deref().filter(|u| !u.trim().is_empty()) {
            None => Ok(TokenStore::new(data_dir)),
            Some(url) => {
                let blobs =
                    std::sync::Arc::new(crate::store::FsBlobs::new(&data_dir.join("blobs")));
                let store = crate::store::PgStore::connect(
                    url,
                    data_dir,
                    blobs,
                    settings.pool_options(),
                )
                .map_err(|e| ServerError::Invalid(format!("the store ([store] url): {e}")))?;
                Ok(TokenStore::in_postgres(
                    data_dir,
                    std::sync::Arc::new(store),
                ))
            }
        }
    }

    fn load(&self) -> Result<TokenFile, ServerError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => toml::from_str(&text).map_err(|e| ServerError::Config {
                path: self.path.clone(),
                message: crate::fsutil::toml_problem(&text, &e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TokenFile::default()),
            Err(e) => Err(ServerError::io("read", &self.path, e)),
        }
    }

    /// Reads the file, lets `change` change it, and writes it back (when `change` says so), under
    /// an exclusive lock on `tokens.toml.lock` beside it: `token create` and `token revoke` run
    /// as processes of their own, and two at once each wrote the file as it was before the
    /// other's change, so that one was lost: a token created and not stored, or one revoked,
    /// said so, and still working. (The file itself cannot be locked: each write replaces it.)
    fn change<T>(
        &self,
        change: impl FnOnce(&mut TokenFile) -> (T, bool),
    ) -> Result<T, ServerError> {
        let lock_path = self.path.with_extension("toml.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| ServerError::io("open", &lock_path, e))?;
        let _locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| ServerError::io("lock", &lock_path, e.into()))?;
        let mut tokens = self.load()?;
        let (out, changed) = change(&mut tokens);
        if changed {
            self.save(&tokens)?;
        }
        Ok(out)
    }

    fn save(&self, file: &TokenFile) -> Result<(), ServerError> {
        let text = toml::to_string(file).map_err(|e| ServerError::Config {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        write_atomic(&self.path, text.as_bytes(), 0o600)
    }

    /// Creates a token for `user` and returns its record and the token, shown once.
    pub fn create(&self, user: &str) -> Result<(TokenRecord, String), ServerError> {
        validate_user(user)?;
        let id = hex(&random_bytes::<4>()?);
        let token = format!("mnd_{id}_{}", hex(&random_bytes::<24>()?));
        let record = TokenRecord {
            id,
            user: user.to_owned(),
            hash: token_hash(&token),
            created_at: now_rfc3339(),
        };
        if let Some(db) = &self.db {
            db.insert_token(&record).map_err(store_error)?;
            return Ok((record, token));
        }
        self.change(|file| {
            file.tokens.push(record.clone());
            ((), true)
        })?;
        Ok((record, token))
    }

    /// Every token record.
    pub fn list(&self) -> Result<Vec<TokenRecord>, ServerError> {
        if let Some(db) = &self.db {
            return db.token_records().map_err(store_error);
        }
        Ok(self.load()?.tokens)
    }

    /// Revokes the token with this id; false when there is none.
    pub fn revoke(&self, id: &str) -> Result<bool, ServerError> {
        if let Some(db) = &self.db {
            return db.delete_token(id).map_err(store_error);
        }
        self.change(|file| {
            let before = file.tokens.len();
            file.tokens.retain(|t| t.id != id);
            let revoked = file.tokens.len() < before;
            (revoked, revoked)
        })
    }

    /// The user a token belongs to, or `None` for an unknown or revoked token.
    pub fn verify(&self, token: &str) -> Result<Option<String>, ServerError> {
        self.verify_hash(&token_hash(token))
    }

    /// [`TokenStore::verify`] of the token whose hash ([`token_hash`]) is `presented`: what a
    /// connection keeps, to check again that its token has not been revoked since its hello.
    pub fn verify_hash(&self, presented: &str) -> Result<Option<String>, ServerError> {
        if let Some(db) = &self.db {
            return db.token_user(presented).map_err(store_error);
        }
        // The stored value is a hash, so looking it up leaks nothing useful through timing:
        // an attacker cannot choose the bytes of the hash it makes.
        Ok(self
            .users()?
            .as_ref()
            .and_then(|(_, users)| users.get(presented).cloned()))
    }

    /// [`TokenStore::verify_hash`] from async code (every connection's hello and every HTTP
    /// request checks its token): a PostgreSQL store answers with a query, run on the blocking
    /// pool so that it holds up no async worker (on a small machine, two requests at once held
    /// up every connection of the server for the query's time); the file's tokens are answered
    /// from memory at once.
    pub async fn verify_hash_off(&self, presented: String) -> Result<Option<String>, ServerError> {
        if self.db.is_none() {
            return self.verify_hash(&presented);
        }
        let tokens = self.clone();
        tokio::task::spawn_blocking(move || tokens.verify_hash(&presented))
            .await
            .map_err(|e| ServerError::Invalid(format!("the token check stopped: {e}")))?
    }

    /// [`TokenStore::verify`] from async code ([`TokenStore::verify_hash_off`]).
    pub async fn verify_off(&self, token: &str) -> Result<Option<String>, ServerError> {
        self.verify_hash_off(token_hash(token)).await
    }

    /// The hash of every token there is now: what the server looks for each connection's token
    /// in, to close those of revoked ones. From memory while the file is unchanged.
    pub fn hashes(&self) -> Result<std::collections::HashSet<String>, ServerError> {
        if let Some(db) = &self.db {
            let records = db.token_records().map_err(store_error)?;
            return Ok(records.into_iter().map(|r| r.hash).collect());
        }
        Ok(self
            .users()?
            .as_ref()
            .map(|(_, users)| users.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// The file's tokens as each hash's user, read again only when the file changed; `None`
    /// when there is no file.
    fn users(&self) -> Result<std::sync::MutexGuard<'_, Option<Cached>>, ServerError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = Stamp::of(&self.path)?;
        let fresh = matches!((&*cache, stamp), (Some((cached, _)), Some(now)) if *cached == now);
        if !fresh {
            *cache = None;
            let users = self
                .load()?
                .tokens
                .into_iter()
                .map(|record| (record.hash, record.user))
                .collect();
            // Stamped as of before the read: a change during the read is seen next time.
            *cache = stamp.map(|stamp| (stamp, users));
        }
        Ok(cache)
    }

    /// How many tokens the in-memory map holds (tests only).
    #[cfg(test)]
    fn cached(&self) -> Option<usize> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.as_ref().map(|(_, users)| users.len())
    }
}

/// A client installation's id, as its hello gives it: a UUID in its canonical lowercase
/// hyphenated form, nothing else. Bindings are keyed by (user, device), so a device id can name
/// nothing but a device of the user whose token the connection presented.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(String);

impl DeviceId {
    /// Checks a device id from a hello.
    pub fn parse(raw: &str) -> Result<DeviceId, String> {
        match monad_protocol::wire::is_device_id(raw) {
            true => Ok(DeviceId(raw.to_owned())),
            false => Err(format!(
                "the device id {raw:?} is not a UUID in lowercase hyphenated form; \
                 `monad-client login` makes one"
            )),
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a client name from a hello ([`monad_protocol::wire::check_client_name`]).
pub use monad_protocol::wire::check_client_name as validate_client_name;

/// A user name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn validate_user(user: &str) -> Result<(), ServerError> {
    let ok = !user.is_empty()
        && user.len() <= 64
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ServerError::Invalid(format!(
            "user name `{}` must be 1 to 64 letters, digits, `.`, `_` or `-`",
            monad_protocol::text::printable(user)
        )))
    }
}

fn store_error(e: crate::store::StoreError) -> ServerError {
    ServerError::Invalid(format!("tokens: {e}"))
}

/// What is stored of a token, and what a connection keeps of it.
pub fn token_hash(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

/// SHA-256 of `bytes` as 64 lowercase hex digits (token hashes, certificate fingerprints).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_bytes<const N: usize>() -> Result<[u8; N], ServerError> {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| ServerError::Invalid("the system random generator failed".into()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `monad-server token create` and `token revoke` run as separate processes, at the same
    /// time when a script makes several: each change lands, and a revoke that says it revoked
    /// holds (each store below has its own open file, as each process would).
    #[test]
    fn tokens_created_and_revoked_at_once_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let doomed: Vec<_> = (0..8)
            .map(|n| {
                TokenStore::new(dir.path())
                    .create(&format!("old{n}"))
                    .unwrap()
            })
            .collect();
        let threads: Vec<_> = (0..16)
            .map(|n| {
                let dir = dir.path().to_owned();
                let revoke = doomed.get(n).map(|(record, _)| record.id.clone());
                std::thread::spawn(move || {
                    let store = TokenStore::new(&dir);
                    match revoke {
                        Some(id) => {
                            assert!(store.revoke(&id).unwrap());
                            None
                        }
                        None => Some(store.create(&format!("new{n}")).unwrap().1),
                    }
                })
            })
            .collect();
        let created: Vec<String> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        let store = TokenStore::new(dir.path());
        for token in &created {
            assert!(
                store.verify(token).unwrap().is_some(),
                "a created token was lost"
            );
        }
        for (_, token) in &doomed {
            assert_eq!(
                store.verify(token).unwrap(),
                None,
                "a revoked token still works"
            );
        }
        assert_eq!(store.list().unwrap().len(), created.len());
    }

    #[test]
    fn tokens_verify_until_revoked_and_are_stored_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        let (record, token) = store.create("ana").unwrap();
        let (_, other) = store.create("ben").unwrap();
        assert_eq!(store.verify(&token).unwrap().as_deref(), Some("ana"));
        assert_eq!(store.verify(&other).unwrap().as_deref(), Some("ben"));
        assert_eq!(store.verify("mnd_nope").unwrap(), None);
        let text = std::fs::read_to_string(dir.path().join("tokens.toml")).unwrap();
        assert!(!text.contains(&token), "the token itself is never stored");
        assert!(store.revoke(&record.id).unwrap());
        assert!(!store.revoke(&record.id).unwrap());
        assert_eq!(store.verify(&token).unwrap(), None);
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn verify_answers_from_memory_and_sees_every_change_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        assert_eq!(store.verify("x").unwrap(), None);
        let (_, ana) = store.create("ana").unwrap();
        assert_eq!(store.verify(&ana).unwrap().as_deref(), Some("ana"));
        assert_eq!(store.cached(), Some(1));
        // Another process (`monad-server token create`) changes the file: seen at once.
        let other = TokenStore::new(dir.path());
        let (record, ben) = other.create("ben").unwrap();
        assert_eq!(store.verify(&ben).unwrap().as_deref(), Some("ben"));
        assert!(other.revoke(&record.id).unwrap());
        assert_eq!(store.verify(&ben).unwrap(), None);
        // A corrupt file is an error, not a stale answer.
        std::fs::write(dir.path().join("tokens.toml"), "[[token]]\nid = 3\n").unwrap();
        assert!(store.verify(&ana).is_err());
        std::fs::remove_file(dir.path().join("tokens.toml")).unwrap();
        assert_eq!(store.verify(&ana).unwrap(), None);
    }

    #[test]
    fn device_ids_are_canonical_uuids_only() {
        let id = "6f9619ff-8b86-4011-b42d-00c04fc964ff";
        assert_eq!(DeviceId::parse(id).unwrap().as_str(), id);
        for bad in [
            "user:ana",
            "",
            "6F9619FF-8B86-4011-B42D-00C04FC964FF",
            "6f9619ff8b864011b42d00c04fc964ff",
            "{6f9619ff-8b86-4011-b42d-00c04fc964ff}",
            "urn:uuid:6f9619ff-8b86-4011-b42d-00c04fc964ff",
            " 6f9619ff-8b86-4011-b42d-00c04fc964ff",
        ] {
            assert!(DeviceId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn client_names_refuse_what_would_break_a_uri_or_a_terminal() {
        for good in [
            "laptop",
            "macbook-pro.local",
            "é",
            &"x".repeat(64),
            "my laptop",
        ] {
            assert!(validate_client_name(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            &"x".repeat(65),
            "a:b",
            "a/b",
            "a\u{1b}[2J",
            "a\nb",
            "a\u{7f}",
            "a\u{202e}b",
            "a\u{200b}b",
            "a\u{2028}b",
            "a\u{feff}",
            "a\u{e0041}",
            // Default-ignorable code points that are not format characters, and tags.
            "report\u{fe0f}",
            "a\u{34f}b",
            "a\u{115f}b",
            "a\u{3164}b",
            "a\u{180b}b",
            "a\u{ffa0}b",
            "a\u{17b4}b",
            "a\u{e0100}b",
            "a\u{e0000}b",
            "a\u{e0002}b",
            "a\u{e001f}b",
        ] {
            assert!(validate_client_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_refused_device_id_says_so_in_one_readable_sentence() {
        let message = DeviceId::parse("user:ana").unwrap_err();
        assert!(!message.contains("  "), "{message:?}");
        assert!(
            message.ends_with("form; `monad-client login` makes one"),
            "{message:?}"
        );
    }

    #[test]
    fn bad_user_names_and_corrupt_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        assert!(store.create("a b").is_err());
        assert!(store.create("").is_err());
        std::fs::write(dir.path().join("tokens.toml"), "[[token]]\nid = 3\n").unwrap();
        let err = store.verify("x").unwrap_err().to_string();
        assert!(err.contains("tokens.toml"), "{err}");
    }
}
