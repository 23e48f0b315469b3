//! Whether the call a job on tokio's blocking pool works for was cancelled. A blocking job is
//! not stopped by dropping the future that waits for it: without this, a cancelled search kept
//! its thread and its memory until it was done, while the call's slot was freed at once, so
//! that a loop of calls cancelled as soon as they started filled the blocking pool every user
//! shares. [`Job::run`] marks the thread for the job; long loops (a walk's directories, a
//! search's files) look at [`cancelled`] and stop early, and the result, which nobody waits
//! for any more, is dropped.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// The flag of the job this thread runs now, if any.
    static FLAG: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Whether the job this thread runs was cancelled (false outside a job).
pub(crate) fn cancelled() -> bool {
    FLAG.with(|flag| {
        flag.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    })
}

/// One blocking job's flag: set when the value (held by the future that waits for the job) is
/// dropped, whether the job finished or not.
#[derive(Debug, Default)]
pub(crate) struct Job(Arc<AtomicBool>);

impl Job {
    /// Runs `work` on this thread as the job's.
    pub(crate) fn run<R>(flag: Arc<AtomicBool>, work: impl FnOnce() -> R) -> R {
        struct Clear;
        impl Drop for Clear {
            fn drop(&mut self) {
                FLAG.with(|f| *f.borrow_mut() = None);
            }
        }
        FLAG.with(|f| *f.borrow_mut() = Some(flag));
        let _clear = Clear;
        work()
    }

    /// The flag, for [`Job::run`].
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
