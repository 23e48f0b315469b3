//! Limits and the command-execution policy: plain values, set by the operator.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Bounds on what one tool call may read, list, find, write or print. Going over a bound truncates
/// the result and says so (`truncated: true`); it never fails silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Bytes of content `read_file` returns at most.
    pub read_max_bytes: u64,
    /// Lines `read_file` returns when the caller gives no `limit`.
    pub read_default_lines: u64,
    /// Entries `list_dir` returns at most.
    pub list_max_entries: usize,
    /// Deepest `depth` `list_dir` accepts.
    pub list_max_depth: u32,
    /// Matching lines `search` returns at most (a caller's `max_results` is capped by this).
    pub search_max_results: usize,
    /// Characters of one matching line `search` returns; longer lines are cut.
    pub search_max_line_chars: usize,
    /// Paths `glob` returns at most.
    pub glob_max_results: usize,
    /// Size of a file `write_file` writes or `edit_file` edits at most.
    pub write_max_bytes: u64,
    /// Bytes of unified diff a write or edit reports; the rest is cut.
    pub diff_max_bytes: usize,
    /// Bytes of standard output and, separately, of standard error that `run_command` keeps.
    pub output_max_bytes: usize,
    /// Time limit of a command when the caller gives none, in milliseconds.
    pub command_default_timeout_ms: u64,
    /// Longest time limit a caller may ask for, in milliseconds.
    pub command_max_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            read_max_bytes: 256 * 1024,
            read_default_lines: 2000,
            list_max_entries: 5000,
            list_max_depth: 32,
            search_max_results: 1000,
            search_max_line_chars: 500,
            glob_max_results: 5000,
            write_max_bytes: 16 * 1024 * 1024,
            diff_max_bytes: 64 * 1024,
            output_max_bytes: 1024 * 1024,
            command_default_timeout_ms: 120_000,
            command_max_timeout_ms: 600_000,
        }
    }
}

impl Limits {
    /// Checks that the limits can be used together: each bound of what a call reads, lists or
    /// finds at least 1 (a zero would cut every result to nothing; what is written, shown of a
    /// diff or kept of a command's output may be 0, an operator's choice) and the default
    /// command time limit within the longest a caller may ask for (otherwise every
    /// `run_command` that gives none would be refused, blaming an argument it never gave).
    /// The error names the keys.
    pub fn check(&self) -> Result<(), String> {
        let at_least_one = [
            ("read_max_bytes", self.read_max_bytes),
            ("read_default_lines", self.read_default_lines),
            ("list_max_entries", self.list_max_entries as u64),
            ("list_max_depth", u64::from(self.list_max_depth)),
            ("search_max_results", self.search_max_results as u64),
            ("search_max_line_chars", self.search_max_line_chars as u64),
            ("glob_max_results", self.glob_max_results as u64),
            (
                "command_default_timeout_ms",
                self.command_default_timeout_ms,
            ),
            ("command_max_timeout_ms", self.command_max_timeout_ms),
        ];
        if let Some((key, _)) = at_least_one.iter().find(|(_, value)| *value == 0) {
            return Err(format!("`limits.{key}` is 0; it must be at least 1"));
        }
        if self.command_default_timeout_ms > self.command_max_timeout_ms {
            return Err(format!(
                "`limits.command_default_timeout_ms` ({}) is above `limits.command_max_timeout_ms` \
                 ({}): a command that gives no time limit gets the default, which must be one a \
                 caller may ask for",
                self.command_default_timeout_ms, self.command_max_timeout_ms
            ));
        }
        Ok(())
    }
}

impl ExecPolicy {
    /// Checks what a command's environment is made of: `env`'s names (not empty, no `=`, no
    /// NUL) and values, and `path_env` (no NUL). Taken as they are, a NUL failed every
    /// `run_command` with an error blaming the agent's `argv`, and a name holding `=` set
    /// another variable than the one named. The error names the key.
    pub fn check(&self) -> Result<(), String> {
        if self.path_env.contains('\0') {
            return Err("`exec.path_env` holds a NUL byte, which no environment can".into());
        }
        for (name, value) in &self.env {
            let shown = monad_protocol::text::printable_name(name);
            if name.is_empty() {
                return Err("`exec.env` names a variable with no name".into());
            }
            if name.contains('=') {
                return Err(format!(
                    "`exec.env.{shown}`: a variable's name cannot hold `=` (it would set `{}` \
                     instead)",
                    monad_protocol::text::printable_name(
                        name.split('=').next().unwrap_or_default()
                    )
                ));
            }
            if name.contains('\0') || value.contains('\0') {
                return Err(format!(
                    "`exec.env.{shown}` holds a NUL byte, which no environment can"
                ));
            }
        }
        Ok(())
    }
}

/// How `run_command` confines the programs it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecPolicy {
    /// Run commands without a sandbox when the kernel cannot enforce landlock. Off by default:
    /// without it, such a kernel refuses every command.
    pub allow_unsandboxed_exec: bool,
    /// Extra directories a command may read (besides the workspace and the system's runtime
    /// directories), e.g. a toolchain under `/opt`.
    pub extra_read_paths: Vec<PathBuf>,
    /// Extra directories a command may read and write.
    pub extra_write_paths: Vec<PathBuf>,
    /// `PATH` inside the sandbox.
    pub path_env: String,
    /// Extra environment variables for commands (the environment is otherwise scrubbed).
    pub env: std::collections::BTreeMap<String, String>,
    /// Address space limit (`RLIMIT_AS`) of each process of a command, in bytes; 0 for none.
    pub max_memory_bytes: u64,
    /// Processes (and threads) a workspace's commands may have at once (`RLIMIT_NPROC`, counted
    /// in the workspace's user namespace, or without namespaces, when Monad runs as root, for
    /// the workspace's own user); 0 for no limit. Not applied without namespaces when Monad runs
    /// as an ordinary user, where the kernel would count Monad's own processes too.
    pub max_processes: u64,
    /// Size of the command's private `/dev/shm` (shared memory, POSIX semaphores), in bytes.
    pub shm_max_bytes: u64,
    /// Background processes a workspace keeps at once (running, or exited with output not read
    /// yet).
    pub max_background: usize,
    /// When Monad runs as root, the user commands run as (a name or a numeric uid; never root).
    /// Unset: the owner of the workspace's folder when that is not root, else a user of the
    /// workspace's own from [`ExecPolicy::uid_range`]. Ignored when Monad runs as an ordinary
    /// user: commands run as that user.
    pub user: Option<String>,
    /// When Monad runs as root: `[first, last]`, the uids (and gids) that workspaces get users
    /// of their own from; none of them may be a user or group of the system. Checked when read:
    /// a range that holds 0, 65534 or 65535 is refused.
    #[serde(deserialize_with = "uid_range")]
    pub uid_range: [u32; 2],
    /// Whether commands run in namespaces of their own (user, PID, mount, IPC, network):
    /// `auto` (when the kernel allows it, else the fallback: a subreaper, seccomp for the
    /// network), `required` (refuse commands when it does not) or `off` (always the fallback).
    pub namespaces: NamespacePolicy,
    /// Largest file a command may write (`RLIMIT_FSIZE`) in bytes.
    pub max_file_bytes: u64,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// What network commands get: `off` (the default), `allowlist` (only the hosts in
    /// [`ExecPolicy::allow`], through Monad's proxy) or `host` (the host's network).
    pub network: NetworkMode,
    /// With `network = "allowlist"`: the destinations commands may reach: `host`, `*.domain`
    /// (any name under it), `host:port`, an IP address, or a CIDR range (`10.1.0.0/16`).
    /// Private, loopback and link-local addresses are refused unless listed as an address or
    /// range.
    pub allow: Vec<String>,
    /// With `network = "allowlist"`: destinations refused even when `allow` lists them (same
    /// forms as `allow`); deny wins.
    pub deny: Vec<String>,
}

/// Whether commands get namespaces of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NamespacePolicy {
    /// When the kernel allows them; else the fallback.
    #[default]
    Auto,
    /// Always; commands are refused where the kernel does not allow them.
    Required,
    /// Never: the fallback (a child subreaper kills what a command leaves; no private
    /// `/dev/shm`; the network can only be all or nothing).
    Off,
}

/// What network a command gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// No network: only a loopback of its own.
    #[default]
    Off,
    /// Only the destinations the policy lists, through Monad's proxy.
    Allowlist,
    /// The host's network, unrestricted.
    Host,
}

/// Reads `[exec] uid_range`, refusing a range that holds root or `nobody` (with the reason).
fn uid_range<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<[u32; 2], D::Error> {
    let range = <[u32; 2]>::deserialize(deserializer)?;
    crate::exec::users::check_range(range).map_err(serde::de::Error::custom)?;
    Ok(range)
}

impl ExecPolicy {
    /// The network a command gets under this policy, in a few words for a person (approval
    /// prompts): `no network`, `network to pypi.org, *.github.com only`, `network to
    /// *.github.com only, never to gist.github.com`, `full network (the host's)`.
    pub fn network_summary(&self) -> String {
        match self.network {
            NetworkMode::Off => "no network".to_owned(),
            NetworkMode::Host => "full network (the host's)".to_owned(),
            NetworkMode::Allowlist if self.allow.is_empty() => {
                "no network (the allowlist is empty)".to_owned()
            }
            NetworkMode::Allowlist if self.deny.is_empty() => {
                format!("network to {} only", self.allow.join(", "))
            }
            // Deny wins over allow: a person reading "to *.github.com" must not take it to
            // include a host the operator refused.
            NetworkMode::Allowlist => format!(
                "network to {} only, never to {}",
                self.allow.join(", "),
                self.deny.join(", ")
            ),
        }
    }
}

impl Default for ExecPolicy {
    fn default() -> Self {
        ExecPolicy {
            allow_unsandboxed_exec: false,
            extra_read_paths: Vec::new(),
            extra_write_paths: Vec::new(),
            path_env: "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".to_owned(),
            env: std::collections::BTreeMap::new(),
            max_memory_bytes: 0,
            max_processes: 1024,
            shm_max_bytes: 256 * 1024 * 1024,
            max_background: 16,
            user: None,
            uid_range: crate::exec::users::DEFAULT_UID_RANGE,
            namespaces: NamespacePolicy::Auto,
            max_file_bytes: 4 * 1024 * 1024 * 1024,
            max_open_files: 1024,
            network: NetworkMode::Off,
            allow: Vec::new(),
            deny: Vec::new(),
        }
    }
}

#[cfg(test)]
mod exec_policy_tests {
    use super::*;

    /// Regression: a NUL in `[exec] env` failed every command with an error blaming the
    /// agent's `argv`, and a name holding `=` set another variable; they are refused where
    /// the config is read, naming the key.
    #[test]
    fn an_environment_no_command_could_get_is_refused_naming_its_key() {
        let with = |name: &str, value: &str| ExecPolicy {
            env: [(name.to_owned(), value.to_owned())].into(),
            ..ExecPolicy::default()
        };
        assert_eq!(with("LANG", "en_US.UTF-8").check(), Ok(()));
        let nul = with("LANG", "en\0US").check().unwrap_err();
        assert!(
            nul.contains("`exec.env.LANG`") && nul.contains("NUL"),
            "{nul}"
        );
        let eq = with("A=B", "c").check().unwrap_err();
        assert!(eq.contains("cannot hold `=`"), "{eq}");
        assert!(with("", "x").check().is_err());
        let path = ExecPolicy {
            path_env: "/bin\0".into(),
            ..ExecPolicy::default()
        };
        assert!(path.check().unwrap_err().contains("exec.path_env"));
        assert_eq!(ExecPolicy::default().check(), Ok(()));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn limits_that_cannot_work_together_are_named() {
        use super::Limits;
        assert_eq!(Limits::default().check(), Ok(()));
        let zero = Limits {
            list_max_entries: 0,
            ..Limits::default()
        };
        assert!(
            zero.check()
                .unwrap_err()
                .contains("`limits.list_max_entries` is 0")
        );
        let no_diff = Limits {
            diff_max_bytes: 0,
            ..Limits::default()
        };
        assert_eq!(no_diff.check(), Ok(()));
        let short_max = Limits {
            command_max_timeout_ms: 1000,
            ..Limits::default()
        };
        let e = short_max.check().unwrap_err();
        assert!(
            e.contains("command_default_timeout_ms` (120000) is above"),
            "{e}"
        );
    }

    use super::*;

    #[test]
    fn the_network_summary_names_what_the_allowlist_refuses() {
        let policy = |network, allow: &[&str], deny: &[&str]| ExecPolicy {
            network,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..ExecPolicy::default()
        };
        assert_eq!(
            policy(NetworkMode::Off, &["x.org"], &[]).network_summary(),
            "no network"
        );
        assert_eq!(
            policy(NetworkMode::Host, &[], &["x.org"]).network_summary(),
            "full network (the host's)"
        );
        assert_eq!(
            policy(NetworkMode::Allowlist, &[], &["x.org"]).network_summary(),
            "no network (the allowlist is empty)"
        );
        assert_eq!(
            policy(NetworkMode::Allowlist, &["pypi.org", "*.github.com"], &[]).network_summary(),
            "network to pypi.org, *.github.com only"
        );
        assert_eq!(
            policy(
                NetworkMode::Allowlist,
                &["*.github.com"],
                &["gist.github.com", "10.0.0.0/8"]
            )
            .network_summary(),
            "network to *.github.com only, never to gist.github.com, 10.0.0.0/8"
        );
    }

    #[test]
    fn a_uid_range_with_root_or_nobody_is_refused_when_the_configuration_is_read() {
        let read = |range: &str| {
            serde_json::from_str::<ExecPolicy>(&format!("{{\"uid_range\": {range}}}"))
                .map(|p| p.uid_range)
                .map_err(|e| e.to_string())
        };
        for bad in [
            "[0, 10]",
            "[60000, 70000]",
            "[100000, 99999]",
            "[1, 4294967295]",
        ] {
            let err = read(bad).expect_err(bad);
            assert!(err.contains("uid_range"), "{bad}: {err}");
        }
        assert_eq!(read("[100000, 165535]"), Ok([100_000, 165_535]));
        assert_eq!(
            serde_json::from_str::<ExecPolicy>("{}").unwrap().uid_range,
            crate::exec::users::DEFAULT_UID_RANGE
        );
    }
}
