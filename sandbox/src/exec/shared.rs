//! What a workspace's commands share: a user namespace owned by the user they run as and, unless
//! they get the host's network, one network namespace with only a loopback. A server a
//! background command starts on `127.0.0.1` is reachable by the workspace's next commands, as on
//! a developer's machine, and by nothing else; and a network namespace, the costliest part of a
//! command's isolation, is made once per workspace instead of once per command. Each command
//! still gets PID and mount namespaces of its own; the workspace's IPC namespace (System V IPC,
//! POSIX message queues) is shared too.
//!
//! With `network = "allowlist"` the network namespace holds the proxy's listening socket: one
//! [`super::proxy`] per workspace, whose reports go to the workspace's
//! [`crate::netlog::NetworkLog`] ([`Slot::network`]).

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use monad_protocol::tools::NetworkEvent;

use super::{Identity, PROXY_PORT, child, netpolicy, proxy};
use crate::error::SandboxError;
use crate::limits::{ExecPolicy, NetworkMode};
use crate::netlog::NetworkLog;

/// A workspace's shared namespaces, alive while this lives (and while a command is in them).
#[derive(Debug)]
pub(crate) struct Shared {
    /// For whom they were made (a workspace whose owner changed gets new ones).
    pub identity: Option<Identity>,
    pub user: OwnedFd,
    pub ipc: OwnedFd,
    pub net: Option<OwnedFd>,
    proxy: Option<tokio::task::AbortHandle>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(proxy) = &self.proxy {
            proxy.abort();
        }
    }
}

/// Why the shared namespaces could not be made.
pub(crate) enum Failure {
    /// The kernel refused them: commands may fall back to running without namespaces.
    Refused(String),
    Other(SandboxError),
}

impl Shared {
    /// Makes them, as `identity` (the caller when `None`), with a network namespace unless the
    /// policy gives commands the host's network, and the allowlist's proxy in it. Needs a tokio
    /// runtime (the proxy runs on it).
    pub(crate) fn make(
        policy: &ExecPolicy,
        identity: Option<Identity>,
        network: &Arc<NetworkLog>,
    ) -> Result<Shared, Failure> {
        use std::os::fd::AsFd;
        let net = policy.network != NetworkMode::Host;
        let allowlist = (policy.network == NetworkMode::Allowlist)
            .then(|| netpolicy::NetPolicy::parse(&policy.allow, &policy.deny))
            .transpose()
            .map_err(|e| Failure::Other(SandboxError::InvalidArguments(e)))?;
        let io = |op: &'static str| {
            move |e: std::io::Error| {
                Failure::Other(SandboxError::Io {
                    op,
                    path: "the workspace's namespaces".into(),
                    source: e,
                })
            }
        };
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| io("make a channel for")(e.into()))?;
        let (uid, gid) = match identity {
            Some(who) => (who.uid, who.gid),
            None => (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            ),
        };
        let spec = child::SharedSpec {
            identity,
            net,
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            proxy_port: allowlist.is_some().then_some(PROXY_PORT),
            to: theirs,
        };
        // The child never runs this program: it sends the namespaces and exits.
        let mut command = std::process::Command::new("/");
        command
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        child::install_shared(&mut command, spec);
        let mut made = match command.spawn() {
            Ok(made) => made,
            Err(e) if e.raw_os_error() == Some(child::NAMESPACES_FAILED) => {
                return Err(Failure::Refused(
                    "unshare or the namespace setup failed (unprivileged user namespaces may be \
                     disabled)"
                        .into(),
                ));
            }
            Err(e) if e.raw_os_error() == Some(child::IDENTITY_FAILED) => {
                return Err(Failure::Other(SandboxError::SandboxUnavailable(
                    "the workspace's namespaces could not be made as its commands' user".into(),
                )));
            }
            Err(e) => return Err(io("make")(e)),
        };
        drop(command);
        let status = made.wait().map_err(io("wait for"))?;
        let fds = receive(ours.as_fd()).map_err(io("receive"))?;
        if !status.success() || fds.len() != 2 + usize::from(net) + usize::from(allowlist.is_some())
        {
            return Err(Failure::Refused(format!(
                "the namespace maker ended with {status} and sent {} descriptors",
                fds.len()
            )));
        }
        let mut fds = fds.into_iter();
        let user = fds.next().expect("counted");
        let ipc = fds.next().expect("counted");
        let net = net.then(|| fds.next().expect("counted"));
        let proxy = match (allowlist, fds.next()) {
            (Some(allowlist), Some(listener)) => {
                let listener = std::net::TcpListener::from(listener);
                listener.set_nonblocking(true).map_err(io("listen with"))?;
                let listener =
                    tokio::net::TcpListener::from_std(listener).map_err(io("listen with"))?;
                let sink = network.clone();
                let report = move |event: NetworkEvent| {
                    tracing::info!(
                        host = %event.host,
                        port = event.port,
                        allowed = event.allowed,
                        reason = event.reason.as_deref().unwrap_or(""),
                        "network"
                    );
                    sink.report(event);
                };
                let task = tokio::spawn(proxy::serve(
                    listener,
                    Arc::new(allowlist),
                    Arc::new(report),
                ));
                Some(task.abort_handle())
            }
            _ => None,
        };
        Ok(Shared {
            identity,
            user,
            ipc,
            net,
            proxy,
        })
    }
}

/// The descriptors the maker sent.
fn receive(channel: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Vec<OwnedFd>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let message = recvmsg::<()>(
        channel.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            fds.extend(received.into_iter().map(child::received));
        }
    }
    Ok(fds)
}

/// What a workspace keeps for its commands, made on its first one: the shared namespaces, a
/// temporary directory (`TMPDIR`, shared by its commands like `/tmp` on a machine, removed
/// with the workspace), and the command's view of the filesystem (masks and binds).
#[derive(Debug, Default)]
pub(crate) struct Slot {
    shared: Mutex<Option<Arc<Shared>>>,
    tmp: Mutex<Option<(Option<Identity>, Arc<tempfile::TempDir>)>>,
    view: Mutex<Option<(ViewKey, View)>>,
    /// The connections its proxy (whichever it has now) was asked for.
    pub network: Arc<NetworkLog>,
}

/// What a view was computed for.
type ViewKey = (std::path::PathBuf, Option<Identity>, std::path::PathBuf);
/// Binds and masks (see [`super::child::Namespaces`]).
type View = (Vec<child::Bind>, Vec<std::ffi::CString>);

impl Slot {
    /// The workspace's shared namespaces for `identity`, made now if there are none yet (or
    /// they were made for another user).
    pub(crate) fn get(
        &self,
        policy: &ExecPolicy,
        identity: Option<Identity>,
    ) -> Result<Arc<Shared>, Failure> {
        let mut slot = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        // Made for this user, and its proxy (if any) still serving: a proxy ends only with the
        // runtime it ran on, and then the workspace's commands are gone too.
        if let Some(shared) = slot.as_ref()
            && shared.identity == identity
            && shared.proxy.as_ref().is_none_or(|p| !p.is_finished())
        {
            return Ok(shared.clone());
        }
        let shared = Arc::new(Shared::make(policy, identity, &self.network)?);
        *slot = Some(shared.clone());
        Ok(shared)
    }

    /// The workspace's temporary directory, owned by `identity` (the caller when `None`).
    pub(crate) fn tmp_dir(
        &self,
        identity: Option<Identity>,
    ) -> std::io::Result<Arc<tempfile::TempDir>> {
        let mut slot = self.tmp.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made_for, dir)) = slot.as_ref()
            && *made_for == identity
            && dir.path().is_dir()
        {
            return Ok(dir.clone());
        }
        let dir = tempfile::Builder::new().prefix("monad-exec-").tempdir()?;
        if let Some(who) = identity {
            std::os::unix::fs::chown(dir.path(), Some(who.uid), Some(who.gid))?;
        }
        let dir = Arc::new(dir);
        *slot = Some((identity, dir.clone()));
        Ok(dir)
    }

    /// The view for commands in `root` as `identity`, computed by `make` the first time (it
    /// depends only on the policy's paths, which do not change, and on these).
    pub(crate) fn view(
        &self,
        root: &std::path::Path,
        identity: Option<Identity>,
        make: impl FnOnce() -> Result<View, SandboxError>,
    ) -> Result<View, SandboxError> {
        let tmp = self
            .tmp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, dir)| dir.path().to_path_buf())
            .unwrap_or_default();
        let key = (root.to_path_buf(), identity, tmp);
        let mut slot = self.view.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made_for, view)) = slot.as_ref()
            && *made_for == key
        {
            return Ok(view.clone());
        }
        let view = make()?;
        *slot = Some((key, view.clone()));
        Ok(view)
    }
}
