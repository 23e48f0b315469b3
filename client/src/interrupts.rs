//! Ending on a signal. `monad-client call`, `mcp` and `acp` act for someone who may stop them
//! (Ctrl-C, a host that ends its server with SIGTERM, as the MCP SDKs do when they shut down, or
//! the terminal they ran in closing, SIGHUP).
//! They then close their connection to the server before exiting, so that the server cancels
//! what they had running at once: a call's approval prompt on the laptop is withdrawn and its
//! command stopped. A process that simply died left the server to notice when the connection
//! timed out, about 8 s later, and until then the folder's owner could still approve a call
//! whose caller was gone, and it ran. After closing, the process ends by the same signal
//! ([`monad_sandbox::signals::die_of`]), so that a shell or a host sees what it would have seen.

use monad_sandbox::signals;
pub use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// SIGINT, SIGTERM and SIGHUP, watched from when this is made: from then on they no longer end
/// the process by themselves, so it is made before the work it interrupts starts. One that the
/// process ignores (a background job of a non-interactive shell ignores SIGINT, `nohup` SIGHUP)
/// stays ignored.
pub struct Interrupts {
    watched: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Interrupts {
    /// Starts watching for SIGINT, SIGTERM and SIGHUP.
    pub fn watch() -> std::io::Result<Interrupts> {
        let mut watched = Vec::new();
        for (which, kind) in [
            (Signal::SIGINT, SignalKind::interrupt()),
            (Signal::SIGTERM, SignalKind::terminate()),
            (Signal::SIGHUP, SignalKind::hangup()),
        ] {
            if !signals::ignored(which) {
                watched.push((which, signal(kind)?));
            }
        }
        Ok(Interrupts { watched })
    }

    /// Waits for the next of them, and says which.
    pub async fn next(&mut self) -> Signal {
        if self.watched.is_empty() {
            // All ignored: nothing ends the work.
            return std::future::pending().await;
        }
        let waits = self.watched.iter_mut().map(|(which, stream)| {
            let which = *which;
            Box::pin(async move {
                stream.recv().await;
                which
            })
        });
        futures_util::future::select_all(waits).await.0
    }

    /// Stops watching: the signals end the process at once again, as the work they would have
    /// interrupted is done.
    pub fn stop(self) {
        for (which, _) in self.watched {
            signals::restore_default(which);
        }
    }
}

/// Ends the process by `signal` ([`monad_sandbox::signals::die_of`]), once what it was caught
/// for is done.
pub fn end_by(signal: Signal) -> ! {
    signals::die_of(signal)
}

/// Why a front closes its connection, for the server's log: `who` closed its side, a signal
/// ended it, or serving failed.
pub(crate) fn ending<T>(ended: &Result<Option<Signal>, T>, who: &str) -> String {
    match ended {
        Ok(Some(signal)) => format!("ended by {signal}"),
        Ok(None) => format!("{who} closed its side"),
        Err(_) => "serving failed".to_owned(),
    }
}
