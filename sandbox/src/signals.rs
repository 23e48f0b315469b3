//! Ending a process as a signal would have, after handling it. `monad-client call`, `mcp` and
//! `acp` catch SIGINT and SIGTERM to close their connection first (so that the server cancels
//! their calls at once), then end by the same signal: a shell running them in a loop stops on
//! Ctrl-C as it would for any program (it continues when a child merely exits with 130), and a
//! parent sees how its child ended. A signal ignored when the process started (a background job
//! of a non-interactive shell ignores SIGINT) stays ignored: it is not caught.

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

/// Whether `signal` is ignored in this process (as it started, until something catches it).
pub fn ignored(signal: Signal) -> bool {
    let mut old = std::mem::MaybeUninit::<nix::libc::sigaction>::zeroed();
    // SAFETY: with a null new action, `sigaction` only writes the current one into `old`,
    // which lives across the call.
    let read = unsafe {
        nix::libc::sigaction(
            signal as nix::libc::c_int,
            std::ptr::null(),
            old.as_mut_ptr(),
        )
    };
    // SAFETY: `old` was zeroed, a valid `sigaction`, and the kernel filled it in when `read`
    // is 0.
    read == 0 && unsafe { old.assume_init() }.sa_sigaction == nix::libc::SIG_IGN
}

/// Gives `signal` back its default action (ending the process), in place of a handler: once the
/// work the handler was for is done, a later signal ends the process at once.
pub fn restore_default(signal: Signal) {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: the default action runs no code of this process.
    let _ = unsafe { sigaction(signal, &default) };
}

/// Ends the process by `signal`: its default action restored, the signal unblocked on this
/// thread and raised. Exits with status 128 + the signal's number if it somehow returns.
pub fn die_of(signal: Signal) -> ! {
    restore_default(signal);
    let mut only = SigSet::empty();
    only.add(signal);
    let _ = only.thread_unblock();
    let _ = nix::sys::signal::raise(signal);
    std::process::exit(128 + signal as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ignored_signal_is_seen_as_ignored_until_its_default_is_restored() {
        // SIGURG: nothing else in the tests sends or handles it, and its default is to ignore
        // it by doing nothing (not SIG_IGN).
        let signal = Signal::SIGURG;
        assert!(!ignored(signal));
        let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
        // SAFETY: ignoring a signal runs no code of this process.
        unsafe { sigaction(signal, &ignore) }.unwrap();
        assert!(ignored(signal));
        restore_default(signal);
        assert!(!ignored(signal));
    }
}
