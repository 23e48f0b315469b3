//! The client's configuration: which server (or which hosts of one deployment), its pinned
//! fingerprint, the token, the device id.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use monad_sandbox::{ExecPolicy, Limits};
use serde::{Deserialize, Serialize};

use monad_protocol::text::printable;

use crate::ClientError;

/// What `monad-client login` saves in `<config dir>/config.toml` (mode 0600: it holds a token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// `HOST:PORT` of the server: the first host tried.
    pub server: String,
    /// `HOST:PORT` of the other hosts of the same deployment (one store, one certificate, so
    /// one pinned fingerprint), tried after `server` in this order. Absent in a config of one
    /// server, which so loads and saves unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
    /// The bearer token.
    pub token: String,
    /// SHA-256 of the server's certificate, 64 hex digits: anything else is refused.
    pub fingerprint: String,
    /// This installation's stable id: a UUID, lowercase and hyphenated, as the server takes it
    /// ([`check_device_id`]). A missing or malformed one is made again at the next login.
    #[serde(default)]
    pub device_id: String,
    /// This machine's name, used in workspace URIs.
    pub client_name: String,
    /// Limits of attached folders' tools (`[limits]`, same keys as the server's); absent keys
    /// keep their defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// How commands in attached folders are confined (`[exec]`, same keys as the server's):
    /// e.g. `extra_read_paths = ["/home/me/.cargo", "/home/me/.rustup"]` so `cargo` can run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecPolicy>,
}

impl ClientConfig {
    /// A config for `server` with a fresh device id and this machine's name.
    pub fn new(server: &str, token: &str, fingerprint: &str) -> Result<ClientConfig, ClientError> {
        Ok(ClientConfig {
            server: server.to_owned(),
            servers: Vec::new(),
            token: token.to_owned(),
            fingerprint: normalize_fingerprint(fingerprint)?,
            device_id: uuid::Uuid::new_v4().to_string(),
            client_name: machine_name(),
            limits: None,
            exec: None,
        })
    }

    /// A config for the hosts `servers` of one deployment (the first is [`ClientConfig::server`],
    /// the others [`ClientConfig::servers`]), each `HOST:PORT` or `HOST` (port 4433); an empty
    /// list, a bad address or one given twice is refused.
    pub fn with_servers(
        servers: &[String],
        token: &str,
        fingerprint: &str,
    ) -> Result<ClientConfig, ClientError> {
        let servers: Vec<String> = servers
            .iter()
            .map(|s| crate::connect::with_default_port(s))
            .collect();
        check_addresses(&servers)?;
        let mut servers = servers.into_iter();
        let first = servers
            .next()
            .expect("check_addresses refuses an empty list");
        let mut config = ClientConfig::new(&first, token, fingerprint)?;
        config.servers = servers.collect();
        Ok(config)
    }

    /// Every host to try, in the config's order: [`ClientConfig::server`], then
    /// [`ClientConfig::servers`].
    pub fn addresses(&self) -> Vec<String> {
        std::iter::once(&self.server)
            .chain(&self.servers)
            .cloned()
            .collect()
    }

    /// The hosts in one line, for messages: `a:4433, b:4433`.
    pub fn shown_servers(&self) -> String {
        self.addresses().join(", ")
    }

    /// Loads `<dir>/config.toml`; refused as [`ClientError::NotLoggedIn`] after a logout.
    pub fn load(dir: &Path) -> Result<ClientConfig, ClientError> {
        let config = ClientConfig::load_any(dir)?;
        if config.token.is_empty() {
            return Err(ClientError::NotLoggedIn(dir.join("config.toml")));
        }
        check_device_id(&config.device_id).map_err(|why| {
            ClientError::Config(format!(
                "{}: {why}; `monad-client login` makes a new one",
                dir.join("config.toml").display()
            ))
        })?;
        Ok(config)
    }

    /// Forgets the token (`logout`); the servers, fingerprint, device id and settings stay, so
    /// that the next login keeps this device's bindings. Returns the servers it was logged in
    /// to (in one line), `None` when it was not.
    ///
    /// A config with a mistake elsewhere (a setting out of range, a bad fingerprint) forgets
    /// its token all the same, in place, the rest left as written for its person to fix: a
    /// logout is what someone does when a token leaked, and it must not wait for that.
    pub fn logout(dir: &Path) -> Result<Option<String>, ClientError> {
        let mut config = match ClientConfig::load_any(dir) {
            Ok(config) if !config.token.is_empty() => config,
            Ok(_) | Err(ClientError::NotLoggedIn(_)) => return Ok(None),
            Err(e @ ClientError::Config(_)) => {
                return match Self::forget_token_in_place(dir)? {
                    Some(servers) => Ok(Some(servers)),
                    None => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        config.token.clear();
        config.save(dir)?;
        Ok(Some(config.shown_servers()))
    }

    /// Sets `token` to empty in the file as it is, which does not load as a config: the
    /// servers it was logged in to, `None` (nothing written) when it is not its user's own,
    /// is not TOML or holds no token.
    fn forget_token_in_place(dir: &Path) -> Result<Option<String>, ClientError> {
        let path = dir.join("config.toml");
        if check_owner(&path).is_err() {
            return Ok(None);
        }
        let Ok(Some(text)) = monad_protocol::settings_file::read(&path) else {
            return Ok(None);
        };
        let Ok(mut doc) = text.parse::<toml_edit::DocumentMut>() else {
            return Ok(None);
        };
        if doc
            .get("token")
            .and_then(|t| t.as_str())
            .is_none_or(str::is_empty)
        {
            return Ok(None);
        }
        doc["token"] = toml_edit::value("");
        let servers: Vec<&str> = match doc.get("servers").and_then(|s| s.as_array()) {
            Some(list) => list.iter().filter_map(|s| s.as_str()).collect(),
            None => doc
                .get("server")
                .and_then(|s| s.as_str())
                .into_iter()
                .collect(),
        };
        let servers = match servers.join(", ") {
            none if none.is_empty() => "its server".to_owned(),
            some => some,
        };
        Self::write_config(dir, |_| Ok(doc.to_string()))?;
        Ok(Some(servers))
    }

    /// Loads `<dir>/config.toml`, also when logged out (its token empty).
    pub fn load_any(dir: &Path) -> Result<ClientConfig, ClientError> {
        let path = dir.join("config.toml");
        let text = monad_protocol::settings_file::read(&path)
            .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?
            .ok_or_else(|| ClientError::NotLoggedIn(path.clone()))?;
        check_owner(&path)?;
        // `PATH:LINE: what`, the line of a TOML mistake from its span, on one line.
        let in_file = |line: Option<usize>, message: &str| {
            let at = match line {
                Some(line) => format!("{}:{line}", path.display()),
                None => path.display().to_string(),
            };
            ClientError::Config(format!("{at}: {}", message.trim()))
        };
        let mut config: ClientConfig = toml::from_str(&text).map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|span| monad_protocol::text::line_at(&text, span.start));
            in_file(line, e.message())
        })?;
        // These say `config: ...` themselves: their message is taken, not their prefix.
        let checked = |e: ClientError| match e {
            ClientError::Config(message) => in_file(None, &message),
            other => other,
        };
        normalize_fingerprint(&config.fingerprint).map_err(checked)?;
        // Every server refuses a hello with such a name: said here, where it can be fixed. An
        // empty one is unset: the machine's name, as a first login gives.
        if config.client_name.is_empty() {
            config.client_name = machine_name();
        }
        monad_protocol::wire::check_client_name(&config.client_name).map_err(|why| {
            in_file(
                None,
                &format!("client_name: {why}; set client_name to another name"),
            )
        })?;
        check_addresses(&config.addresses()).map_err(checked)?;
        if let Some(limits) = &config.limits {
            limits.check().map_err(|message| in_file(None, &message))?;
        }
        if let Some(exec) = &config.exec {
            exec.check().map_err(|message| in_file(None, &message))?;
        }
        Ok(config)
    }

    /// Saves atomically to `<dir>/config.toml`, mode 0600; through a symbolic link there, to
    /// the file it leads to (a dotfiles repository's), which is written, not replaced by a file
    /// of its own. A file there already keeps what it says beside the connection's keys
    /// ([`ClientConfig::OWN_KEYS`], set or removed in place): its comments, its order, and its
    /// `[limits]` and `[exec]` as written, absent keys left to their defaults.
    pub fn save(&self, dir: &Path) -> Result<(), ClientError> {
        let fresh = toml::to_string(self).map_err(|e| ClientError::Config(e.to_string()))?;
        Self::write_config(dir, |old| {
            Ok(old
                .and_then(|old| Self::merged(old, &fresh))
                .unwrap_or(fresh))
        })
    }

    /// Writes `<dir>/config.toml` atomically, mode 0600, as [`ClientConfig::save`] says, with
    /// the text `make` gives from what the file there says when it is its user's own (`None`
    /// otherwise: another user's `[exec]` would be taken on). The directory is synced after
    /// the rename, so that a crash does not bring back the old token.
    fn write_config(
        dir: &Path,
        make: impl FnOnce(Option<&str>) -> Result<String, ClientError>,
    ) -> Result<(), ClientError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ClientError::Config(format!("{}: {e}", dir.display())))?;
        let given = dir.join("config.toml");
        let path = std::fs::canonicalize(&given).unwrap_or_else(|_| given.clone());
        let file_name = path.file_name().map_or_else(
            || "config.toml".into(),
            |name| name.to_string_lossy().into_owned(),
        );
        // A name of this write's own, made anew (never a file or link someone put there
        // first: the token goes in it).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = path.with_file_name(format!(".{file_name}.{}.{nanos}.tmp", std::process::id()));
        let old = match monad_protocol::settings_file::read(&path) {
            Ok(Some(old)) if check_owner(&path).is_ok() => Some(old),
            _ => None,
        };
        let text = make(old.as_deref())?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            // Leave no half-written copy beside the config (it may hold the token).
            let _ = std::fs::remove_file(&tmp);
            ClientError::Config(format!("{}: {e}", given.display()))
        })?;
        // The file is in place: a directory that cannot be synced (some FUSE and 9p mounts
        // refuse) is said, and the save stands.
        if let Some(parent) = path.parent()
            && let Err(e) = std::fs::File::open(parent).and_then(|d| d.sync_all())
        {
            tracing::warn!("cannot sync {}: {e}", parent.display());
        }
        Ok(())
    }

    /// The keys `login` and `logout` write: the connection's. Everything else in the file is
    /// the person's, kept as written.
    pub const OWN_KEYS: [&str; 6] = [
        "server",
        "servers",
        "token",
        "fingerprint",
        "device_id",
        "client_name",
    ];

    /// `old`'s text with [`ClientConfig::OWN_KEYS`] as in `fresh` (this config, serialized):
    /// each set in place, or removed where `fresh` leaves it out. `None` when either does not
    /// parse as TOML.
    fn merged(old: &str, fresh: &str) -> Option<String> {
        let mut doc: toml_edit::DocumentMut = old.parse().ok()?;
        let fresh: toml_edit::DocumentMut = fresh.parse().ok()?;
        for key in Self::OWN_KEYS {
            match fresh.get(key) {
                Some(value) => match doc.get_mut(key) {
                    // In place: the key's comments and position stay.
                    Some(item) => *item = value.clone(),
                    None => {
                        doc.insert(key, value.clone());
                    }
                },
                None => {
                    doc.remove(key);
                }
            }
        }
        Some(doc.to_string())
    }
}

/// The hosts as given, checked: at least one, each a `HOST:PORT` with a host and a port
/// number, none twice.
pub fn check_addresses(addresses: &[String]) -> Result<(), ClientError> {
    if addresses.is_empty() {
        return Err(ClientError::Config(
            "no server: give at least one HOST:PORT".into(),
        ));
    }
    for (i, address) in addresses.iter().enumerate() {
        check_address(address)?;
        if addresses[..i].contains(address) {
            return Err(ClientError::Config(format!(
                "the server `{}` is listed twice",
                printable(address)
            )));
        }
    }
    Ok(())
}

/// One `HOST:PORT` ([`monad_protocol::address::check_host_port`]).
fn check_address(address: &str) -> Result<(), ClientError> {
    monad_protocol::address::check_host_port(address).map_err(|why| {
        ClientError::Config(format!(
            "`{}` is not a server address: {why} (expected HOST:PORT, like \
             monad.example.com:4433 or 10.0.0.2:4433)",
            printable(address)
        ))
    })
}

/// Checks a device id: a UUID in its lowercase hyphenated form, the only form the server
/// takes (it keys this device's bindings).
pub fn check_device_id(id: &str) -> Result<(), String> {
    match monad_protocol::wire::is_device_id(id) {
        true => Ok(()),
        false if id.is_empty() => Err("no device_id".to_owned()),
        false => Err(format!(
            "device_id `{}` is not a UUID in lowercase hyphenated form",
            printable(id)
        )),
    }
}

/// `MONAD_CONFIG_DIR`, else the platform config dir + `monad`. An empty `MONAD_CONFIG_DIR` is
/// unset (as `MONAD_CONFIG_DIR= monad-client ...` means), never the current directory.
pub fn default_config_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MONAD_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    directories::BaseDirs::new().map(|d| d.config_dir().join("monad"))
}

/// The user's home directory with its links resolved, as the folders it holds are named
/// (`~/...` in a workspace's URI, an editor's locations, the warning of attaching it whole);
/// `None` when there is none or it cannot be resolved.
pub fn canonical_home() -> Option<PathBuf> {
    directories::BaseDirs::new().and_then(|d| d.home_dir().canonicalize().ok())
}

/// Accepts `sha256:AB:CD...`, `AB CD ...` or plain hex; returns 64 lowercase hex digits.
pub fn normalize_fingerprint(raw: &str) -> Result<String, ClientError> {
    let trimmed = raw.trim();
    let body = trimmed
        .strip_prefix("sha256:")
        .or_else(|| trimmed.strip_prefix("SHA256:"))
        .unwrap_or(trimmed);
    let hex: String = body
        .chars()
        .filter(|c| !matches!(c, ':' | ' '))
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex)
    } else {
        Err(ClientError::Config(format!(
            "`{}` is not a certificate fingerprint: expected the 64 hex digits that \
             monad-server prints at start-up",
            printable(raw)
        )))
    }
}

fn machine_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .and_then(|s| usable_name(&s))
        .or_else(|| std::env::var("HOSTNAME").ok().and_then(|s| usable_name(&s)))
        .unwrap_or_else(|| "client".to_owned())
}

/// A machine's name as a client name a server takes: without what a name may not hold (a
/// control or invisible character, `:`, `/`), at most 64 characters; `None` when nothing is
/// left. An empty `HOSTNAME` made every login refused ("the client name \"\" must be 1 to 64
/// characters"), with no word of where the name came from.
fn usable_name(raw: &str) -> Option<String> {
    let name: String = raw
        .trim()
        .chars()
        .filter(|&c| !monad_protocol::text::is_hidden(c) && !matches!(c, ':' | '/'))
        .take(64)
        .collect();
    let name = name.trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// Refuses a config another user could have written: one that belongs to another user (but
/// root), or that others may write. It holds the token and the server's fingerprint: whoever can
/// change it can send the token to a server of their own, or loosen the folder's sandbox (as
/// ssh refuses such a key or config).
fn check_owner(path: &Path) -> Result<(), ClientError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(ClientError::Config(format!(
            "{} belongs to another user (uid {}): it holds your token, so it is not used; \
             log in again with a config directory of your own (MONAD_CONFIG_DIR)",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(ClientError::Config(format!(
            "{} may be written by other users (mode {:o}): it holds your token, so it is not \
             used; `chmod go-w {}` and check what it says",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: an empty `HOSTNAME` (no `/etc/hostname`), or one holding what a client name
    /// may not, made a client name the server refuses at every login.
    #[test]
    fn a_machine_name_is_made_one_a_server_takes() {
        assert_eq!(usable_name("laptop\n").as_deref(), Some("laptop"));
        assert_eq!(usable_name("  "), None);
        assert_eq!(usable_name("").as_deref(), None);
        assert_eq!(usable_name("work:laptop/1").as_deref(), Some("worklaptop1"));
        assert_eq!(usable_name(&"x".repeat(100)).map(|n| n.len()), Some(64));
        assert_eq!(usable_name("a\u{200b}b").as_deref(), Some("ab"));
    }

    /// Regression: the config was written through a fixed temporary name opened without
    /// `O_EXCL` or `O_NOFOLLOW` (another user's file or link there got the token), and read
    /// whoever could write it.
    #[test]
    fn the_config_is_written_only_to_a_file_of_its_own_and_read_only_when_its_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig::new("127.0.0.1:4433", "mnd_x", &"ab".repeat(32)).unwrap();
        // What the fixed name was: a link to a file of someone else's.
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".config.toml.tmp")).unwrap();
        config.save(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        let path = dir.path().join("config.toml");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(ClientConfig::load_any(dir.path()).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = ClientConfig::load_any(dir.path()).unwrap_err().to_string();
        assert!(e.contains("may be written by other users"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(ClientConfig::load_any(dir.path()).is_ok());
        let fresh = tempfile::tempdir().unwrap();
        let nested = fresh.path().join("monad");
        config.save(&nested).unwrap();
        assert_eq!(
            std::fs::metadata(&nested).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn fingerprints_are_normalized_or_refused() {
        let hex = "ab".repeat(32);
        assert_eq!(normalize_fingerprint(&hex).unwrap(), hex);
        assert_eq!(
            normalize_fingerprint(&format!("SHA256:{}", hex.to_uppercase())).unwrap(),
            hex
        );
        let colons: Vec<&str> = std::iter::repeat_n("AB", 32).collect();
        assert_eq!(normalize_fingerprint(&colons.join(":")).unwrap(), hex);
        assert!(normalize_fingerprint("abc").is_err());
        assert!(normalize_fingerprint(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn mistakes_in_the_file_say_where_once_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig::new("127.0.0.1:4433", "mnd_x", &"ab".repeat(32)).unwrap();
        config.save(dir.path()).unwrap();
        let path = dir.path().join("config.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let next = text.lines().count() + 1;
        let cases = [
            (format!("{text}garbage = = \n"), format!(":{next}: ")),
            (
                format!("{text}[limits]\nread_max_byts = 5\n"),
                format!(":{}: ", next + 1),
            ),
            (
                format!("{text}[limits]\ncommand_max_timeout_ms = 5\n"),
                ": `limits.".to_owned(),
            ),
            (
                text.replace(&"ab".repeat(32), "nope"),
                ": `nope` is not".to_owned(),
            ),
        ];
        for (written, wanted) in cases {
            std::fs::write(&path, &written).unwrap();
            let shown = ClientConfig::load_any(dir.path()).unwrap_err().to_string();
            assert!(
                shown.starts_with(&format!("config: {}{wanted}", path.display())),
                "{shown}"
            );
            assert!(!shown.contains('\n'), "one line: {shown}");
            assert_eq!(shown.matches("config:").count(), 1, "{shown}");
        }
    }

    #[test]
    fn limits_and_exec_policy_are_read_from_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig::new("127.0.0.1:4433", "mnd_x", &"0".repeat(64)).unwrap();
        config.save(dir.path()).unwrap();
        let path = dir.path().join("config.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(
            "\n[exec]\nextra_read_paths = [\"/opt/tools\"]\n[limits]\nread_max_bytes = 10\n",
        );
        std::fs::write(&path, text).unwrap();
        let loaded = ClientConfig::load(dir.path()).unwrap();
        assert_eq!(loaded.limits.unwrap().read_max_bytes, 10);
        assert_eq!(
            loaded.exec.unwrap().extra_read_paths,
            [std::path::PathBuf::from("/opt/tools")]
        );
        std::fs::write(&path, "server = 1\n").unwrap();
        let err = ClientConfig::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.toml"), "{err}");
    }

    #[test]
    fn config_round_trips_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig::new("127.0.0.1:4433", "mnd_x", &"0".repeat(64)).unwrap();
        config.save(dir.path()).unwrap();
        assert_eq!(ClientConfig::load(dir.path()).unwrap(), config);
        let mode = std::fs::metadata(dir.path().join("config.toml"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            ClientConfig::load(empty.path()),
            Err(ClientError::NotLoggedIn(_))
        ));
    }

    /// A device id the server would refuse is reported where the config is read, naming the
    /// file and what makes a new one (before, every command failed at the server with advice
    /// that `login` did not follow); missing, it loads, so that `login` can make one.
    #[test]
    fn a_device_id_the_server_would_refuse_is_reported_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (line, said) in [
            ("device_id = \"nope\"\n", "device_id `nope` is not a UUID"),
            (
                "device_id = \"6F1C3B9E-2D4A-4C8E-9F1A-0B2C3D4E5F60\"\n",
                "not a UUID in lowercase",
            ),
            ("", "no device_id"),
        ] {
            let text = format!(
                "server = \"10.0.0.2:4433\"\ntoken = \"mnd_x\"\nfingerprint = \"{}\"\n\
                 {line}client_name = \"laptop\"\n",
                "ab".repeat(32)
            );
            std::fs::write(dir.path().join("config.toml"), &text).unwrap();
            let err = ClientConfig::load(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains(said) && err.contains("config.toml") && err.contains("login"),
                "{err}"
            );
            assert!(ClientConfig::load_any(dir.path()).is_ok(), "{line}");
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_config_of_one_server_written_before_several_hosts_loads_and_saves_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let old = format!(
            "server = \"10.0.0.2:4433\"\ntoken = \"mnd_x\"\nfingerprint = \"{}\"\n\
             device_id = \"6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f60\"\nclient_name = \"laptop\"\n",
            "ab".repeat(32)
        );
        std::fs::write(dir.path().join("config.toml"), &old).unwrap();
        let loaded = ClientConfig::load(dir.path()).unwrap();
        assert_eq!(loaded.server, "10.0.0.2:4433");
        assert!(loaded.servers.is_empty());
        assert_eq!(loaded.addresses(), ["10.0.0.2:4433"]);
        loaded.save(dir.path()).unwrap();
        let saved = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
        assert_eq!(saved, old, "no `servers` key is added");
    }

    /// `logout` and a later `login` rewrote the whole file from what was loaded: comments
    /// gone, every default of `[limits]` and `[exec]` written in, and a `config.toml` that is a
    /// link replaced by a file of its own (the token left in the file it led to, while
    /// `logout` said it was forgotten). Now only the login's keys change, in place.
    #[test]
    fn saving_changes_only_the_logins_keys_in_place_and_writes_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let dotfiles = dir.path().join("dotfiles");
        let config_dir = dir.path().join("config");
        std::fs::create_dir_all(&dotfiles).unwrap();
        std::fs::create_dir_all(&config_dir).unwrap();
        let old = format!(
            "# my laptop's Monad\nserver = \"10.0.0.2:4433\"\ntoken = \"mnd_secret\"\n\
             fingerprint = \"{}\"\ndevice_id = \"6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f60\"\n\
             # set by hand\nclient_name = \"work-laptop\"\n\n\
             [exec]\n# for cargo\nextra_read_paths = [\"/home/me/.rustup\"]\n",
            "ab".repeat(32)
        );
        let real = dotfiles.join("monad.toml");
        std::fs::write(&real, &old).unwrap();
        let link = config_dir.join("config.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(ClientConfig::logout(&config_dir).unwrap().is_some());
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link stays a link"
        );
        let after = std::fs::read_to_string(&real).unwrap();
        assert!(!after.contains("mnd_secret"), "{after}");
        assert_eq!(after, old.replace("mnd_secret", ""), "nothing else changed");
        assert!(matches!(
            ClientConfig::load(&config_dir),
            Err(ClientError::NotLoggedIn(_))
        ));
        // A login to several hosts: its keys set, `servers` added; the rest as written.
        let mut config = ClientConfig::load_any(&config_dir).unwrap();
        config.token = "mnd_new".into();
        config.servers = vec!["10.0.0.3:4433".into()];
        config.save(&config_dir).unwrap();
        let after = std::fs::read_to_string(&real).unwrap();
        for kept in ["# my laptop's Monad", "# set by hand", "# for cargo"] {
            assert!(after.contains(kept), "{kept}: {after}");
        }
        assert!(
            !after.contains("path_env"),
            "no default written in: {after}"
        );
        let loaded = ClientConfig::load(&config_dir).unwrap();
        assert_eq!(loaded.token, "mnd_new");
        assert_eq!(loaded.addresses(), ["10.0.0.2:4433", "10.0.0.3:4433"]);
        assert_eq!(loaded.client_name, "work-laptop");
        assert_eq!(
            loaded.exec.unwrap().extra_read_paths,
            [PathBuf::from("/home/me/.rustup")]
        );
        // No temporary copy is left, here or beside the file the link leads to.
        assert_eq!(std::fs::read_dir(&config_dir).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(&dotfiles).unwrap().count(), 1);
    }

    /// A config with a mistake beside the token (a limit out of range) would not load, and
    /// `logout` failed on it: the token stayed on disk. Now it is forgotten in place, the rest
    /// as written; a file that is not TOML, or holds no token, is left alone with its error.
    #[test]
    fn logout_forgets_the_token_of_a_config_with_a_mistake_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let old = format!(
            "# mine\nserver = \"10.0.0.2:4433\"\ntoken = \"mnd_leaked\"\nfingerprint = \"{}\"\n\
             device_id = \"6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f60\"\nclient_name = \"laptop\"\n\
             [limits]\nread_max_bytes = 0\n",
            "ab".repeat(32)
        );
        std::fs::write(&path, &old).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        assert!(matches!(
            ClientConfig::load_any(dir.path()),
            Err(ClientError::Config(_))
        ));
        let servers = ClientConfig::logout(dir.path()).unwrap();
        assert_eq!(servers.as_deref(), Some("10.0.0.2:4433"));
        let after = std::fs::read_to_string(&path).unwrap();
        assert_eq!(after, old.replace("mnd_leaked", ""));
        // Again: nothing to forget, the mistake is said.
        let e = ClientConfig::logout(dir.path()).unwrap_err();
        assert!(e.to_string().contains("read_max_bytes"), "{e}");
        // Not TOML: left as it is.
        std::fs::write(&path, "token = \"mnd_x\"\n[limits\n").unwrap();
        assert!(ClientConfig::logout(dir.path()).is_err());
        assert!(std::fs::read_to_string(&path).unwrap().contains("mnd_x"));
    }

    /// A client name every server refuses (`:` in it, a control character) failed each
    /// attach with the server's word only, and login kept it: the config's load says so,
    /// naming the file and the key. An empty one is the machine's name.
    #[test]
    fn a_client_name_no_server_takes_is_an_error_where_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let with = |name: &str| {
            format!(
                "server = \"10.0.0.2:4433\"\ntoken = \"mnd_x\"\nfingerprint = \"{}\"\n\
                 device_id = \"6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f60\"\nclient_name = {}\n",
                "ab".repeat(32),
                toml::Value::String(name.to_owned())
            )
        };
        for bad in ["my:laptop", "a/b", "bell\u{7}", &"x".repeat(65)] {
            std::fs::write(&path, with(bad)).unwrap();
            let e = ClientConfig::load(dir.path()).unwrap_err().to_string();
            assert!(
                e.contains("config.toml") && e.contains("client_name"),
                "{bad:?}: {e}"
            );
        }
        std::fs::write(&path, with("")).unwrap();
        let loaded = ClientConfig::load(dir.path()).unwrap();
        assert!(
            monad_protocol::wire::check_client_name(&loaded.client_name).is_ok(),
            "{:?}",
            loaded.client_name
        );
    }

    #[test]
    fn several_hosts_round_trip_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig::with_servers(
            &strings(&["b.example", "10.0.0.1:5000", "[::1]:7"]),
            "mnd_x",
            &"0".repeat(64),
        )
        .unwrap();
        assert_eq!(config.server, "b.example:4433");
        assert_eq!(config.servers, ["10.0.0.1:5000", "[::1]:7"]);
        config.save(dir.path()).unwrap();
        let loaded = ClientConfig::load(dir.path()).unwrap();
        assert_eq!(loaded, config);
        assert_eq!(
            loaded.addresses(),
            ["b.example:4433", "10.0.0.1:5000", "[::1]:7"]
        );
        assert_eq!(
            loaded.shown_servers(),
            "b.example:4433, 10.0.0.1:5000, [::1]:7"
        );
    }

    #[test]
    fn an_empty_list_a_bad_address_or_one_given_twice_is_refused_clearly() {
        let fp = "0".repeat(64);
        let err = ClientConfig::with_servers(&[], "t", &fp)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no server"), "{err}");
        for (bad, says) in [
            ("", "no port"),
            ("a b:1", "not a host name"),
            ("host:0", "the port is not a number"),
            ("host:99999", "the port is not a number"),
            ("host:x", "the port is not a number"),
            (":4433", "not a host name"),
        ] {
            let err = check_addresses(&strings(&[bad])).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
        let err = ClientConfig::with_servers(&strings(&["a:1", "b:2", "a:1"]), "t", &fp)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`a:1` is listed twice"), "{err}");
        // `login --server host:99999` names the port the user typed, not `host:99999:4433`.
        let err = ClientConfig::with_servers(&strings(&["host:99999"]), "t", &fp)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`host:99999` is not a server address: the port is not a number"),
            "{err}"
        );
        // In a file: the error names the file, and nothing loads.
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig::new("127.0.0.1:4433", "mnd_x", &fp).unwrap();
        config.save(dir.path()).unwrap();
        let path = dir.path().join("config.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("servers = [\"nope\"]\n{text}")).unwrap();
        let err = ClientConfig::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("config.toml") && err.contains("`nope`"),
            "{err}"
        );
        std::fs::write(&path, format!("servers = \"a:1\"\n{text}")).unwrap();
        let err = ClientConfig::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.toml"), "{err}");
    }
}
