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

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
    /// The kernel refuses them for good (see [`refusal`]): commands may fall back to running
    /// without namespaces.
    Refused(String),
    Other(SandboxError),
}

/// Longest the maker may take to answer.
const MAKER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a maker that stopped at `stage` with `errno` says that this kernel refuses the
/// namespaces commands need, for good (pure): `unshare(CLONE_NEWUSER)` refused (disabled, or
/// `user.max_user_namespaces` = 0, the one case of `ENOSPC` that is not a passing shortage),
/// or a namespace made but not usable (its maps, the other namespaces, a mount in it refused).
/// Anything else (no descriptor or memory free, a signal) is a passing failure.
pub(crate) fn refusal(
    stage: child::MakerStage,
    errno: i32,
    max_user_namespaces: Option<u64>,
) -> bool {
    use child::MakerStage;
    use nix::libc::{EACCES, EINVAL, ENOSPC, ENOSYS, EPERM};
    match stage {
        MakerStage::User => {
            matches!(errno, EPERM | EACCES | EINVAL | ENOSYS)
                || (errno == ENOSPC && max_user_namespaces == Some(0))
        }
        MakerStage::Maps | MakerStage::Mount => matches!(errno, EPERM | EACCES),
        MakerStage::Namespaces => matches!(errno, EPERM | EACCES | EINVAL),
        MakerStage::Identity | MakerStage::Open | MakerStage::Network => false,
    }
}

/// How the maker ended, when it did not send the namespaces.
#[derive(Debug)]
enum MakerEnd {
    /// It said where it stopped.
    Stopped(child::MakerStage, i32),
    /// It ended without a word: a signal, or its last message failed.
    Died(std::process::ExitStatus),
    /// The caller's side failed (the channel, writing the maps).
    Here(&'static str, std::io::Error),
    /// It did not answer in time (and was killed).
    TimedOut,
}

impl Shared {
    /// Makes them, as `identity` (the caller when `None`), with a network namespace unless the
    /// policy gives commands the host's network, and the allowlist's proxy in it. Needs a tokio
    /// runtime (the proxy runs on it).
    pub(crate) fn make(
        policy: &ExecPolicy,
        identity: Option<Identity>,
        network: &Arc<NetworkLog>,
        budget: Option<super::proxy::Budget>,
    ) -> Result<Shared, Failure> {
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
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| io("make a channel for")(e.into()))?;
        nix::sys::socket::setsockopt(
            &ours,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(MAKER_TIMEOUT.as_secs() as _, 0),
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
        let pid = child::spawn_maker(&spec).map_err(io("start the maker of"))?;
        drop(spec);
        let pid = nix::unistd::Pid::from_raw(pid);
        let talked = talk(
            &ours,
            pid,
            &format!("{uid} {uid} 1\n"),
            &format!("{gid} {gid} 1\n"),
        );
        if talked.is_err() {
            // Our own child, not reaped yet: the pid is still its.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let status = wait(pid);
        let expected = 2 + usize::from(net) + usize::from(allowlist.is_some());
        let fds = match talked {
            Ok(fds) if fds.len() == expected => fds,
            Ok(fds) => {
                return Err(Failure::Other(SandboxError::SandboxUnavailable(format!(
                    "the namespace maker sent {} descriptors, not {expected}",
                    fds.len()
                ))));
            }
            Err(MakerEnd::Died(_)) => return Err(died(status)),
            Err(end) => return Err(failure(end)),
        };
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
                    budget,
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

/// The maker's side of the talk (see [`child::spawn_maker`]): its namespaces, or how it ended.
/// As root, writes the maps of the maker's user namespace when it asks.
fn talk(
    channel: &OwnedFd,
    maker: nix::unistd::Pid,
    uid_map: &str,
    gid_map: &str,
) -> Result<Vec<OwnedFd>, MakerEnd> {
    loop {
        let (message, fds) = match receive(channel.as_fd()) {
            Ok(received) => received,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(MakerEnd::TimedOut),
            Err(e) => return Err(MakerEnd::Here("hear from", e)),
        };
        match message.first() {
            None => return Err(MakerEnd::Died(std::process::ExitStatus::default())),
            Some(&child::MAKER_DONE) => return Ok(fds),
            Some(&child::MAKER_MAP_ME) => {
                write_maps(maker, uid_map, gid_map).map_err(|e| match e.raw_os_error() {
                    Some(errno) => MakerEnd::Stopped(child::MakerStage::Maps, errno),
                    None => MakerEnd::Here("map the user of", e),
                })?;
                nix::sys::socket::send(
                    channel.as_raw_fd(),
                    &[child::MAKER_GO_ON],
                    nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                )
                .map_err(|e| MakerEnd::Here("answer", e.into()))?;
            }
            Some(&child::MAKER_FAILED) if message.len() == 6 => {
                let stage = child::MakerStage::from_byte(message[1]);
                let errno = i32::from_ne_bytes(message[2..6].try_into().expect("4 bytes"));
                return Err(match stage {
                    Some(stage) => MakerEnd::Stopped(stage, errno),
                    None => MakerEnd::Here(
                        "understand",
                        std::io::Error::other("a stage the maker does not have"),
                    ),
                });
            }
            Some(_) => {
                return Err(MakerEnd::Here(
                    "understand",
                    std::io::Error::other("a message the maker does not send"),
                ));
            }
        }
    }
}

/// Writes `setgroups` (`deny`), `uid_map` and `gid_map` of `maker`'s user namespace (root
/// writes them for a maker that runs as another user and stays undumpable).
fn write_maps(maker: nix::unistd::Pid, uid_map: &str, gid_map: &str) -> std::io::Result<()> {
    use std::io::Write;
    for (file, text) in [
        ("setgroups", "deny"),
        ("uid_map", uid_map),
        ("gid_map", gid_map),
    ] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{maker}/{file}"))?
            .write_all(text.as_bytes())?;
    }
    Ok(())
}

/// Reaps the maker: how it ended.
fn wait(maker: nix::unistd::Pid) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    loop {
        match nix::sys::wait::waitpid(maker, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
                return Some(std::process::ExitStatus::from_raw(code << 8));
            }
            Ok(nix::sys::wait::WaitStatus::Signaled(_, signal, _)) => {
                return Some(std::process::ExitStatus::from_raw(signal as i32));
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// A maker that ended without a word: a passing failure.
fn died(status: Option<std::process::ExitStatus>) -> Failure {
    let how = status.map_or_else(|| "vanished".to_owned(), |s| format!("ended with {s}"));
    Failure::Other(SandboxError::SandboxUnavailable(format!(
        "the process that makes the workspace's namespaces {how} before it was done; the next \
         command tries again"
    )))
}

/// What a maker's end means: a refusal for good, or a passing failure.
fn failure(end: MakerEnd) -> Failure {
    match end {
        MakerEnd::Stopped(stage, errno) => {
            let max = (stage == child::MakerStage::User && errno == nix::libc::ENOSPC)
                .then(|| {
                    std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
                        .ok()?
                        .trim()
                        .parse()
                        .ok()
                })
                .flatten();
            let what = match stage {
                child::MakerStage::Identity => "taking on the commands' user",
                child::MakerStage::User => "unshare(CLONE_NEWUSER)",
                child::MakerStage::Maps => "writing the user namespace's uid and gid maps",
                child::MakerStage::Namespaces => "making the IPC, PID and network namespaces",
                child::MakerStage::Mount => "mounting in a mount namespace of the user namespace",
                child::MakerStage::Open => "opening the namespaces",
                child::MakerStage::Network => "bringing up the loopback (or the proxy's socket)",
            };
            let err = std::io::Error::from_raw_os_error(errno);
            if refusal(stage, errno, max) {
                Failure::Refused(format!("{what} failed: {err}"))
            } else {
                Failure::Other(SandboxError::Io {
                    op: "make",
                    path: format!("the workspace's namespaces ({what})"),
                    source: err,
                })
            }
        }
        MakerEnd::Died(status) => died(Some(status)),
        MakerEnd::Here(op, source) => Failure::Other(SandboxError::Io {
            op,
            path: "the process that makes the workspace's namespaces".into(),
            source,
        }),
        MakerEnd::TimedOut => Failure::Other(SandboxError::SandboxUnavailable(format!(
            "the process that makes the workspace's namespaces did not answer within {} s",
            MAKER_TIMEOUT.as_secs()
        ))),
    }
}

/// One message from the maker and the descriptors it carries (empty: the maker is gone).
fn receive(channel: std::os::fd::BorrowedFd<'_>) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut bytes = [0u8; 16];
    let mut iov = [std::io::IoSliceMut::new(&mut bytes)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let (len, fds) = loop {
        match recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => {
                let mut fds = Vec::new();
                for cmsg in message.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        fds.extend(received.into_iter().map(child::received));
                    }
                }
                break (message.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    Ok((bytes[..len].to_vec(), fds))
}

/// What a workspace keeps for its commands, made on its first one: the shared namespaces, a
/// temporary directory (`TMPDIR`, shared by its commands like `/tmp` on a machine, removed
/// with the workspace), the command's view of the filesystem (masks and binds), and the user of
/// its own that a folder root owns runs as (see [`super::users`]).
#[derive(Debug, Default)]
pub(crate) struct Slot {
    shared: Mutex<Option<Arc<Shared>>>,
    tmp: Mutex<Option<Arc<TmpDir>>>,
    view: Mutex<Option<(ViewKey, View)>>,
    own_user: Mutex<Option<Identity>>,
    /// The connections its proxy (whichever it has now) was asked for.
    pub network: Arc<NetworkLog>,
    /// The connections its proxy may hold, with every other proxy of its user's.
    pub budget: Option<super::proxy::Budget>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(who) = *self.own_user.lock().unwrap_or_else(|p| p.into_inner()) {
            super::users::release(who.uid);
        }
    }
}

/// What a view was computed for.
type ViewKey = (std::path::PathBuf, Option<Identity>, std::path::PathBuf);
/// Binds and masks (see [`super::child::Namespaces`]).
type View = (Vec<child::Bind>, Vec<std::ffi::CString>);

/// A workspace's temporary directory: `tmp`, owned by the commands' user, inside a directory of
/// the caller's (root's, when it runs as root) that only its owner may change, so that the
/// commands' user can neither move `tmp` nor put anything in its place. Removed when dropped;
/// left behind by a process that was killed, and then removed by the next process of Monad that
/// makes one ([`sweep_leftovers`]).
#[derive(Debug)]
pub(crate) struct TmpDir {
    outer: tempfile::TempDir,
    inner: std::path::PathBuf,
    identity: Option<Identity>,
    /// The device and inode of `tmp` when it was made.
    id: (u64, u64),
    /// The lock on `ALIVE`, held while this process lives (the kernel lets go of it when the
    /// process ends, however it ends); `None` on a file system that refuses locks, where the
    /// directory has no `ALIVE` and a sweep leaves it alone.
    _alive: Option<nix::fcntl::Flock<std::fs::File>>,
}

/// What the directories of [`TmpDir`] start with, in the system's temporary directory.
const TMP_PREFIX: &str = "monad-exec-";
/// The file in a [`TmpDir`]'s outer directory that its process holds locked while it lives.
const ALIVE: &str = "alive";

/// Removes the directories of [`TmpDir`] in `base` whose process is gone: those whose `ALIVE`
/// file nobody holds locked (a lock works across processes, users and PID namespaces, where a
/// process id would not). Only directories of this user's, and only a regular file of this
/// user's as `ALIVE`, opened without following a link or waiting (another user may have made a
/// `monad-exec-*` of their own, with a link or a pipe in it); one without `ALIVE` (being made,
/// or from an older version) is left alone. `tmp` goes first and `ALIVE` last, so that a
/// directory that cannot be removed whole keeps its mark for the next sweep. Returns how many
/// were removed.
fn sweep_leftovers(base: &std::path::Path) -> usize {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let me = nix::unistd::geteuid().as_raw();
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            continue;
        }
        let dir = entry.path();
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == me) {
            continue;
        }
        let Ok(alive) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(dir.join(ALIVE))
        else {
            continue;
        };
        if !alive.metadata().is_ok_and(|m| m.is_file() && m.uid() == me) {
            continue;
        }
        // Held by its process while it lives; ours only once that process is gone.
        let Ok(_gone) = nix::fcntl::Flock::lock(alive, nix::fcntl::FlockArg::LockExclusiveNonblock)
        else {
            continue;
        };
        let gone = std::fs::remove_dir_all(dir.join("tmp"))
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| std::fs::remove_dir_all(&dir));
        match gone {
            Ok(()) => removed += 1,
            Err(e) => tracing::debug!("cannot remove {}: {e}", dir.display()),
        }
    }
    removed
}

impl TmpDir {
    fn make(identity: Option<Identity>) -> std::io::Result<TmpDir> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
        // Once per process: what a killed process of Monad left behind.
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            let removed = sweep_leftovers(&std::env::temp_dir());
            if removed > 0 {
                tracing::info!("removed {removed} temporary directories of ended processes");
            }
        });
        let outer = tempfile::Builder::new().prefix(TMP_PREFIX).tempdir()?;
        // Locked before it is named `ALIVE`, so that a sweep never finds it unlocked. A file
        // system that refuses locks gets no `ALIVE`: the directory is then only removed when
        // dropped, as before there were sweeps.
        let held = outer.path().join(".alive");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&held)?;
        let alive = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        {
            Ok(alive) => {
                std::fs::rename(&held, outer.path().join(ALIVE))?;
                Some(alive)
            }
            Err((_, e)) => {
                tracing::debug!("no lock for {}: {e}", outer.path().display());
                std::fs::remove_file(&held)?;
                None
            }
        };
        // Others may pass through (to `tmp`), not list it nor change it.
        std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o711))?;
        let inner = outer.path().join("tmp");
        std::fs::DirBuilder::new().mode(0o700).create(&inner)?;
        if let Some(who) = identity {
            std::os::unix::fs::lchown(&inner, Some(who.uid), Some(who.gid))?;
        }
        let meta = std::fs::symlink_metadata(&inner)?;
        Ok(TmpDir {
            outer,
            inner,
            identity,
            id: (meta.dev(), meta.ino()),
            _alive: alive,
        })
    }

    /// `TMPDIR`.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.inner
    }

    /// Whether both directories are still the ones made (not moved, nor replaced).
    fn intact(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let outer = std::fs::symlink_metadata(self.outer.path());
        let inner = std::fs::symlink_metadata(&self.inner);
        outer.is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw())
            && inner.is_ok_and(|m| m.is_dir() && (m.dev(), m.ino()) == self.id)
    }
}

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
        let shared = Arc::new(Shared::make(
            policy,
            identity,
            &self.network,
            self.budget.clone(),
        )?);
        *slot = Some(shared.clone());
        Ok(shared)
    }

    /// The workspace's temporary directory, owned by `identity` (the caller when `None`); made
    /// again when it was moved or replaced.
    pub(crate) fn tmp_dir(&self, identity: Option<Identity>) -> std::io::Result<Arc<TmpDir>> {
        let mut slot = self.tmp.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = slot.as_ref()
            && dir.identity == identity
            && dir.intact()
        {
            return Ok(dir.clone());
        }
        let dir = Arc::new(TmpDir::make(identity)?);
        *slot = Some(dir.clone());
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
            .map(|dir| dir.path().to_path_buf())
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

    /// Drops the view: a path in it changed, the next one is made afresh.
    pub(crate) fn forget_view(&self) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The user of its own that this workspace's commands run as (a folder root owns, as
    /// root), chosen by `choose` the first time and kept while the workspace is open.
    pub(crate) fn own_user(
        &self,
        choose: impl FnOnce() -> Result<Identity, SandboxError>,
    ) -> Result<Identity, SandboxError> {
        let mut slot = self.own_user.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(who) = *slot {
            return Ok(who);
        }
        let who = choose()?;
        *slot = Some(who);
        Ok(who)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use child::MakerStage;
    use nix::libc::{EACCES, EINVAL, EMFILE, ENOMEM, ENOSPC, EPERM};

    /// A killed process leaves its commands' temporary directory behind: the next process that
    /// makes one removes it, and nothing of a process still running, nor what is not its own.
    #[test]
    fn temporary_directories_of_ended_processes_are_swept_and_live_ones_are_kept() {
        let base = tempfile::tempdir().unwrap();
        let dir = |name: &str| {
            let dir = base.path().join(format!("{TMP_PREFIX}{name}"));
            std::fs::create_dir_all(dir.join("tmp/deep")).unwrap();
            std::fs::write(dir.join("tmp/deep/file"), "x").unwrap();
            dir
        };
        let ended = dir("ended");
        std::fs::write(ended.join(ALIVE), "").unwrap();
        let live = dir("live");
        std::fs::write(live.join(ALIVE), "").unwrap();
        let held = nix::fcntl::Flock::lock(
            std::fs::File::open(live.join(ALIVE)).unwrap(),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        let unmarked = dir("unmarked");
        let other = base.path().join("not-monad");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(ALIVE), "").unwrap();
        let link = base.path().join(format!("{TMP_PREFIX}link"));
        std::os::unix::fs::symlink(&ended, &link).unwrap();
        // What another user could make: a pipe (opening it would wait for ever) and a link
        // (opening it would open what it points to) as `ALIVE`.
        let piped = dir("piped");
        nix::unistd::mkfifo(&piped.join(ALIVE), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let linked = dir("linked");
        std::os::unix::fs::symlink("/dev/null", linked.join(ALIVE)).unwrap();

        // The link is not followed; the directory it points to goes under its own name.
        assert_eq!(sweep_leftovers(base.path()), 1);
        assert!(!ended.exists());
        assert!(live.join("tmp/deep/file").exists());
        assert!(unmarked.exists() && other.exists() && piped.exists() && linked.exists());
        assert!(std::fs::symlink_metadata(&link).is_ok());
        drop(held);
        assert_eq!(sweep_leftovers(base.path()), 1);
        assert!(!live.exists());

        // One being made is locked before it is named: a sweep never takes it.
        let made = TmpDir::make(None).unwrap();
        let outer = made.path().parent().unwrap().to_path_buf();
        assert!(outer.join(ALIVE).exists());
        sweep_leftovers(outer.parent().unwrap());
        assert!(made.path().is_dir());
        drop(made);
        assert!(!outer.exists());
    }

    #[test]
    fn only_a_kernel_that_refuses_for_good_turns_namespaces_off() {
        // Disabled, or made but not usable (AppArmor's restriction).
        assert!(refusal(MakerStage::User, EPERM, None));
        assert!(refusal(MakerStage::User, EINVAL, None));
        assert!(refusal(MakerStage::User, ENOSPC, Some(0)));
        assert!(refusal(MakerStage::Maps, EPERM, None));
        assert!(refusal(MakerStage::Namespaces, EPERM, None));
        assert!(refusal(MakerStage::Mount, EACCES, None));
        // Shortages pass: no descriptor, no memory, too many namespaces of this user now.
        assert!(!refusal(MakerStage::User, ENOSPC, Some(15_000)));
        assert!(!refusal(MakerStage::User, ENOSPC, None));
        assert!(!refusal(MakerStage::User, ENOMEM, None));
        assert!(!refusal(MakerStage::Namespaces, ENOMEM, None));
        assert!(!refusal(MakerStage::Open, EMFILE, None));
        assert!(!refusal(MakerStage::Network, EMFILE, None));
        assert!(!refusal(MakerStage::Maps, EMFILE, None));
        // Not the kernel's namespaces at all.
        assert!(!refusal(MakerStage::Identity, EPERM, None));
    }
}
