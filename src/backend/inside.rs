//! Which of its queues' own transactions a thread is inside, so that a call
//! that would wait for that transaction answers
//! [`Error::InsideTransaction`] at once instead.
//!
//! Every backend marks the thread for as long as it holds one of the queue's
//! transactions (SQLite: its write gate, for any write; PostgreSQL and
//! MySQL: the connection `QueueExt::transaction` and `ctx.transaction` hand
//! to the caller's closure). A database is named by the address of the
//! queue's connection handle, which lives as long as the queue does: clones
//! of one `Queue` share it. Threads of the worker (fetcher, completer,
//! heartbeater, maintenance) never run a caller's closure, so they are never
//! marked; a handler thread inside `ctx.transaction` is.

use std::cell::RefCell;

use crate::error::{Error, Result};

thread_local! {
    /// The databases (by handle address) whose transaction this thread holds.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// This thread, inside a transaction of one queue's database, until dropped.
#[derive(Debug)]
pub(crate) struct Inside {
    id: usize,
}

impl Inside {
    /// Marks this thread inside the transaction of database `id`;
    /// [`Error::InsideTransaction`] when it is already: the second
    /// transaction would wait for the first.
    pub(crate) fn enter(id: usize) -> Result<Inside> {
        refuse(id)?;
        HELD.with(|held| held.borrow_mut().push(id));
        Ok(Inside { id })
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(at) = held.iter().rposition(|d| *d == self.id) {
                held.remove(at);
            }
        });
    }
}

/// Whether this thread is inside a transaction of database `id`.
pub(crate) fn is_inside(id: usize) -> bool {
    HELD.with(|held| held.borrow().contains(&id))
}

/// Whether this thread is inside any queue's transaction.
pub(crate) fn is_inside_any() -> bool {
    HELD.with(|held| !held.borrow().is_empty())
}

/// [`Error::InsideTransaction`] when this thread is inside a transaction of
/// database `id`: a write of the queue's own would wait for it (a lock it
/// holds, a connection it holds) or be a second transaction beside it.
pub(crate) fn refuse(id: usize) -> Result<()> {
    if is_inside(id) {
        return Err(Error::InsideTransaction);
    }
    Ok(())
}

/// The address of `handle`, naming its database in this module.
pub(crate) fn id_of<T>(handle: &T) -> usize {
    handle as *const T as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_inside_until_the_guard_drops_and_only_for_its_database() -> Result<()> {
        let (a, b) = (1usize, 2usize);
        assert!(!is_inside(a));
        {
            let _inside = Inside::enter(a)?;
            assert!(is_inside(a));
            assert!(!is_inside(b), "another database is not held");
            assert!(matches!(Inside::enter(a), Err(Error::InsideTransaction)));
            assert!(matches!(refuse(a), Err(Error::InsideTransaction)));
            refuse(b)?;
            // Another thread is not inside.
            let other = std::thread::spawn(move || is_inside(a))
                .join()
                .map_err(|_| Error::Database("thread panicked".into()))?;
            assert!(!other);
        }
        assert!(!is_inside(a));
        refuse(a)?;
        Ok(())
    }
}
