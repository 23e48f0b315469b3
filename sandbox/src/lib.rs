//! Monad's sandbox: the jail every tool call runs in, on the server and on attached clients.
//!
//! - [`Jail`] holds a workspace root as an open [`cap_std::fs::Dir`]. Its constructor,
//!   [`Jail::open_ambient`], is the only place a path is opened with ambient authority; every
//!   path from a tool argument is checked by [`Jail::resolve`] and opened through the handle, so
//!   `..`, absolute paths, symbolic links and magic links cannot lead outside the root, even when
//!   another process swaps links while a call runs.
//! - [`Sandbox`] is a jail plus its [`Limits`] and [`ExecPolicy`]; it runs the workspace tools
//!   (`read_file`, `list_dir`, `stat`, `search`, `glob`, `write_file`, `edit_file`,
//!   `run_command`), typed through [`monad_protocol::tools`] or by name with JSON through
//!   [`Sandbox::call`].
//! - Commands run under landlock, applied in the child only, with rlimits, a scrubbed
//!   environment, a time limit that kills the whole process group and capped output
//!   (see [`exec`]). A kernel that cannot enforce landlock refuses commands unless the operator
//!   set [`ExecPolicy::allow_unsandboxed_exec`].
//!
//! Errors are [`SandboxError`]s; [`SandboxError::to_tool_error`] turns one into the wire error.
#![deny(missing_docs)]

mod error;
#[allow(unsafe_code)]
pub mod exec;
mod fs;
mod jail;
mod limits;
mod walk;

use std::path::Path;
use std::sync::Arc;

use monad_protocol::ToolName;
use monad_protocol::tools::{
    EditFileArgs, GlobArgs, GlobResult, ListDirArgs, ListDirResult, ReadFileArgs, ReadFileResult,
    RunCommandArgs, RunCommandResult, SearchArgs, SearchResult, StatArgs, StatResult,
    WriteFileArgs, WriteResult,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::{EscapeReason, SandboxError};
pub use jail::{Jail, JailPath};
pub use limits::{ExecPolicy, Limits};

/// A workspace's jail with its limits and command policy: what runs the workspace tools.
#[derive(Debug)]
pub struct Sandbox {
    jail: Jail,
    limits: Limits,
    exec: ExecPolicy,
}

impl Sandbox {
    /// Opens `root` as a workspace (see [`Jail::open_ambient`] on ambient authority).
    pub fn open(root: &Path, limits: Limits, exec: ExecPolicy) -> std::io::Result<Sandbox> {
        Ok(Sandbox {
            jail: Jail::open_ambient(root)?,
            limits,
            exec,
        })
    }

    /// The jail.
    pub fn jail(&self) -> &Jail {
        &self.jail
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// `read_file`: lines of a text file, capped in lines and bytes.
    pub fn read_file(&self, args: &ReadFileArgs) -> Result<ReadFileResult, SandboxError> {
        fs::read_file(&self.jail, &self.limits, args)
    }

    /// `list_dir`: a directory's entries, sorted, to a depth, capped.
    pub fn list_dir(&self, args: &ListDirArgs) -> Result<ListDirResult, SandboxError> {
        fs::list_dir(&self.jail, &self.limits, args)
    }

    /// `stat`: one path's kind, size, mode and time; links described, not followed.
    pub fn stat(&self, args: &StatArgs) -> Result<StatResult, SandboxError> {
        fs::stat(&self.jail, args)
    }

    /// `search`: regex search over files, honouring `.gitignore`, capped.
    pub fn search(&self, args: &SearchArgs) -> Result<SearchResult, SandboxError> {
        walk::search(&self.jail, &self.limits, args)
    }

    /// `glob`: paths matching a glob, honouring `.gitignore`, capped.
    pub fn glob(&self, args: &GlobArgs) -> Result<GlobResult, SandboxError> {
        walk::glob(&self.jail, &self.limits, args)
    }

    /// `write_file`: atomic create or replace, with a diff.
    pub fn write_file(&self, args: &WriteFileArgs) -> Result<WriteResult, SandboxError> {
        fs::write_file(&self.jail, &self.limits, args)
    }

    /// `edit_file`: a unique (or every) replacement, atomic, with a diff.
    pub fn edit_file(&self, args: &EditFileArgs) -> Result<WriteResult, SandboxError> {
        fs::edit_file(&self.jail, &self.limits, args)
    }

    /// The unified diff a `write_file` or `edit_file` call would make, without making it (for
    /// approval prompts); `None` for other tools and for calls that would fail.
    pub fn preview(&self, tool: ToolName, args: &serde_json::Value) -> Option<String> {
        fs::preview(&self.jail, &self.limits, tool, args)
    }

    /// Whether `path` names something that exists inside the root (links are not followed at
    /// the last component). Used for routing probes; reveals nothing but existence.
    pub fn exists(&self, path: &str) -> bool {
        self.jail
            .resolve(path)
            .is_ok_and(|p| self.jail.dir().symlink_metadata(p.rel()).is_ok())
    }

    /// `run_command`: a sandboxed program, with a time limit and capped output.
    pub async fn run_command(
        &self,
        args: &RunCommandArgs,
    ) -> Result<RunCommandResult, SandboxError> {
        exec::run_command(&self.jail, &self.limits, &self.exec, args).await
    }

    /// Runs a workspace tool by name with JSON arguments and returns its JSON result. File tools
    /// run on tokio's blocking pool. Session-level tools (`workspaces`, `memory_*`) are not
    /// workspace tools and are refused here.
    pub async fn call(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, SandboxError> {
        match tool {
            ToolName::ReadFile => {
                // The content is moved into the JSON value, not copied: a 64 MiB read would
                // otherwise be copied once more here.
                let mut result = self.run_blocking(tool, args, Sandbox::read_file).await?;
                let content = std::mem::take(&mut result.content);
                let mut value = to_json(result)?;
                value["content"] = serde_json::Value::String(content);
                Ok(value)
            }
            ToolName::ListDir => self.blocking(tool, args, Sandbox::list_dir).await,
            ToolName::Stat => self.blocking(tool, args, Sandbox::stat).await,
            ToolName::Search => self.blocking(tool, args, Sandbox::search).await,
            ToolName::Glob => self.blocking(tool, args, Sandbox::glob).await,
            ToolName::WriteFile => self.blocking(tool, args, Sandbox::write_file).await,
            ToolName::EditFile => self.blocking(tool, args, Sandbox::edit_file).await,
            ToolName::RunCommand => {
                let args: RunCommandArgs = parse_args(tool, args)?;
                to_json(self.run_command(&args).await?)
            }
            ToolName::Workspaces | ToolName::MemoryStore | ToolName::MemoryRecall => {
                Err(SandboxError::InvalidArguments(format!(
                    "`{tool}` is a session tool, not a workspace tool"
                )))
            }
        }
    }

    async fn blocking<A, R>(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        run: fn(&Sandbox, &A) -> Result<R, SandboxError>,
    ) -> Result<serde_json::Value, SandboxError>
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
    {
        to_json(self.run_blocking(tool, args, run).await?)
    }

    async fn run_blocking<A, R>(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        run: fn(&Sandbox, &A) -> Result<R, SandboxError>,
    ) -> Result<R, SandboxError>
    where
        A: DeserializeOwned + Send + 'static,
        R: Send + 'static,
    {
        let args: A = parse_args(tool, args)?;
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || run(&this, &args))
            .await
            .map_err(|e| SandboxError::Io {
                op: "run",
                path: String::new(),
                source: std::io::Error::other(e.to_string()),
            })?
    }
}

fn parse_args<A: DeserializeOwned>(
    tool: ToolName,
    args: serde_json::Value,
) -> Result<A, SandboxError> {
    serde_json::from_value(args).map_err(|e| SandboxError::InvalidArguments(format!("{tool}: {e}")))
}

fn to_json<R: Serialize>(result: R) -> Result<serde_json::Value, SandboxError> {
    serde_json::to_value(result).map_err(|e| SandboxError::Io {
        op: "encode result of",
        path: String::new(),
        source: std::io::Error::other(e),
    })
}
